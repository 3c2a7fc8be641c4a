"""A code task's project: its files from the payload, a shipped project or a folder under projects_root, each
checked (no path outside those roots, UTF-8 text, printable names, a size cap)."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from omrl.envs.base import InvalidTask, Task
from omrl.shipped import shipped_datasets_dir

MAX_PROJECT_BYTES = 8 << 20  # a project folder read into a task (it is shown to the agent and stored)


def project_files(task: Task, projects_root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The task's project: payload["files"] (path -> text), or the folder payload["project"] names among the
    shipped code_tasks/ (then under projects_root), or payload["project_dir"], a folder inside projects_root.

    Raises InvalidTask for anything else: a name with `..` or an absolute path, a folder outside those roots
    (symbolic links included), files that are not UTF-8 text, names with control characters, too big a project.
    """
    payload = task.payload
    if isinstance(payload.get("files"), dict):
        files = payload["files"]
        bad = next((k for k, v in files.items() if not isinstance(k, str) or not isinstance(v, str)), None)
        if bad is not None:
            raise InvalidTask(f"code task {task.id!r}: payload.files must map paths to text; {bad!r} does not")
        return dict(files)
    roots = [shipped_datasets_dir() / "code_tasks"] + ([Path(projects_root)] if projects_root else [])
    if payload.get("project_dir") is not None:
        if not projects_root:
            raise InvalidTask(f"code task {task.id!r}: payload.project_dir is read only inside a projects root the "
                              "user names (env option projects_root=DIR); use payload.project for a shipped project")
        folder = _inside(Path(projects_root), Path(projects_root, str(payload["project_dir"])))
        if folder is None:
            raise InvalidTask(f"code task {task.id!r}: payload.project_dir {str(payload['project_dir'])!r} is not a "
                              f"folder inside the projects root {projects_root}")
    elif payload.get("project"):
        name = payload["project"]
        if not isinstance(name, str) or not all(_PROJECT_PART.fullmatch(part) for part in name.split("/")):
            raise InvalidTask(f"code task {task.id!r}: payload.project {name!r} is not a project name (letters, digits, "
                              "'.', '_', '-' and '/' between names; no '..', no absolute path)")
        folder = next((found for root in roots if (found := _inside(root, root / name)) is not None), None)
        if folder is None:
            where = " or ".join(str(root) for root in roots)
            raise InvalidTask(f"code task {task.id!r}: no project {name!r} in {where}"
                              + ("" if projects_root else " (name your own projects' folder with the env option "
                                                         "projects_root=DIR)"))
    else:
        raise InvalidTask(f"code task {task.id!r} names no project (payload needs files, project or project_dir)")
    return _read_project(task, folder)


_PROJECT_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _inside(root: Path, candidate: Path) -> Path | None:
    """candidate, resolved, when it is a folder inside root (resolved too), else None."""
    try:
        base, found = root.resolve(), candidate.resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    if found != base and base in found.parents and found.is_dir():
        return found
    return None


def _read_project(task: Task, folder: Path) -> dict[str, str]:
    files, size = {}, 0
    for top, folders, names in os.walk(folder):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(names) + [f for f in folders if os.path.islink(os.path.join(top, f))]:
            path = Path(top, name)
            relative = str(path.relative_to(folder))
            problem = name_problem(relative)
            if problem:
                raise InvalidTask(f"code task {task.id!r}: project file {relative!r}: {problem}")
            if path.is_symlink() or not path.is_file():
                raise InvalidTask(f"code task {task.id!r}: project file {relative!r} is a symbolic link or not a "
                                  "regular file; projects are copied as plain files")
            data = path.read_bytes()
            size += len(data)
            if size > MAX_PROJECT_BYTES:
                raise InvalidTask(f"code task {task.id!r}: project {folder.name} is larger than "
                                  f"{MAX_PROJECT_BYTES >> 20} MB")
            try:
                files[relative] = data.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidTask(f"code task {task.id!r}: project file {relative!r} is not UTF-8 text") from None
    return dict(sorted(files.items()))


_BIDI_CONTROLS = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def name_problem(path: str) -> str | None:
    """Why a file path cannot name a project file (a control character, a lone surrogate), or None."""
    for i, char in enumerate(path):
        if unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs") or char in _BIDI_CONTROLS:
            kind = "a lone surrogate" if unicodedata.category(char) == "Cs" else "a control character"
            return f"it contains {kind} ({char!r}) at character {i}; file names must be printable text"
    return None
