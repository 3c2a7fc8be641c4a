"""What an agent's patch may change before SWE scoring: the tests and everything that steers pytest stay original.

A policy trained on "the tests pass" learns to make the tests pass by any means: rewrite a test to `assert True`,
add a conftest.py hook that marks every report passed, a sitecustomize.py or .pth file that runs at start-up,
a compiled .pyc that shadows a test module. SWE-bench resets the test files before running them; omrl does
the same, in two layers that do not depend on each other:

- `sanitise(patch, original)` drops every file section of the patch that touches a protected path (a test file,
  the pytest configuration, or a start-up hook) and names what it dropped (for the turn's info);
- `SWEEP` runs inside the scoring sandbox after the patches are applied and before pytest: every protected
  file of the original tree is restored from a read-only copy of it, and every protected file the original does
  not have is deleted, whatever path parsing the first layer missed.

What stays out of reach of any pytest-based scorer: package code runs in pytest's own process, so code that
reaches into pytest's objects can still change what pytest reports. `forgery_signs` names added lines that
name the test runner or reach into the interpreter, and scoring refuses those patches (a residual risk
remains: a forger that hides every such name).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from os import PathLike
from pathlib import PurePosixPath

# Files whose mere presence changes how Python starts or how pytest collects and reports.
HOOK_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", ".pytest.ini",
                        "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml"})
HOOK_SUFFIXES = (".pth", ".pyc", ".pyo")
HOOK_FOLDERS = ("__pycache__",)
HOOK_FOLDER_SUFFIXES = (".dist-info", ".egg-info")  # entry points: pytest plugins, console scripts
TEST_FOLDERS = frozenset({"test", "tests", "testing"})
_TEST_FILE = re.compile(r"(^test_.*|.*_test)\.py$")
CONTROL_PREFIX = ".omrl-"  # the scoring sandbox's own files in the project folder: never the agent's to touch
IMPORT_ROOTS = ("", "src")  # where the tests import from (PYTHONPATH), so where a new module can shadow one
# Added lines only a forger needs: the test runner by name, the interpreter's module table, frames or tracing,
# every live object, an exit that skips the runner's own, objects equal to anything.
_FORGERY = re.compile(r"\b_?pytest|\bjunit|\bpluggy\b|\bunittest\b|\bsys\.(modules|_getframe|settrace|setprofile|argv)"
                      r"|\bgc\.get_(objects|referrers)|\bos\._exit\b|\batexit\b|/proc/self|\binspect\.(stack|currentframe)"
                      r"|def __(eq|ne|hash|bool)__")


def protected(path: str, original: frozenset[str] = frozenset()) -> bool:
    """True for a path a fix must not touch: the scorer's control files, a test file or folder, pytest's configuration, a start-up hook
    (sitecustomize, .pth), compiled code, package metadata, and a module or package that `original` (the
    original tree's files) does not have at the top of an import root (it could shadow pytest or the stdlib)."""
    parts = PurePosixPath(path.lstrip("/")).parts
    if not parts:
        return False
    name = parts[-1]
    if parts[0].startswith(CONTROL_PREFIX):  # the scorer's own files beside the tree (patches, the guard)
        return True
    if any(p in TEST_FOLDERS for p in parts[:-1]) or _TEST_FILE.match(name) or name in HOOK_NAMES:
        return True
    if any(p in HOOK_FOLDERS or p.endswith(HOOK_FOLDER_SUFFIXES) for p in parts) or name.endswith(HOOK_SUFFIXES):
        return True
    return bool(original) and _new_top_module(parts, original)


def _new_top_module(parts: tuple[str, ...], original: frozenset[str]) -> bool:
    """A module file or package folder directly in an import root that the original tree does not have."""
    tops = _import_root_entries(original)
    for root in IMPORT_ROOTS:
        depth = len(PurePosixPath(root).parts)
        if len(parts) > depth and parts[:depth] == PurePosixPath(root).parts:
            top = parts[depth]
            is_module = top.endswith((".py", ".so", ".pyd")) or len(parts) > depth + 1
            if is_module and top not in tops:
                return True
    return False


@functools.lru_cache(maxsize=8)
def _import_root_entries(original: frozenset[str]) -> frozenset[str]:
    """The names directly inside an import root in the original tree (computed once per tree)."""
    names = set()
    for path in original:
        parts = PurePosixPath(path).parts
        for root in IMPORT_ROOTS:
            depth = len(PurePosixPath(root).parts)
            if len(parts) > depth and parts[:depth] == PurePosixPath(root).parts:
                names.add(parts[depth])
    return frozenset(names)


def sections(patch: str) -> list[tuple[str, set[str]]]:
    """The patch cut into its per-file sections (git's `diff --git` headers), each with every path it names."""
    found: list[tuple[str, set[str]]] = []
    current: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            found.append(("".join(current), _paths(current)))
            current = []
        current.append(line)
    if current:
        found.append(("".join(current), _paths(current)))
    return found


def sanitise(patch: str, original: Iterable[str] = ()) -> tuple[str, list[str]]:
    """(the patch without the sections that touch a protected path, the sorted paths those sections named)."""
    known = frozenset(original)
    kept, dropped = [], set()
    for text, paths in sections(patch):
        hit = {p for p in paths if protected(p, known)}
        if hit or not paths:  # a section whose paths cannot be read is not trusted either
            dropped |= hit or {"(a patch section without a readable path)"}
        else:
            kept.append(text)
    return "".join(kept), sorted(dropped)


def forgery_signs(patch: str) -> list[str]:
    """Added lines of a patch that name the test runner or reach into the interpreter the way only a forger
    needs (see _FORGERY); scoring refuses a patch that has any."""
    added = [line[1:] for text, _ in sections(patch) for line in text.splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    return forged_lines(added)


def forged_lines(lines: Iterable[str]) -> list[str]:
    """The lines (stripped, cut at 200 characters) that show a sign of forging (see _FORGERY)."""
    return [line.strip()[:200] for line in lines if _FORGERY.search(line)]


def _paths(lines: list[str]) -> set[str]:
    """Every path a section's header names (a/ and b/ prefixes taken off; /dev/null left out)."""
    paths: set[str] = set()
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("diff --git "):
            paths |= _git_header_paths(line[len("diff --git "):])
        elif line.startswith(("--- ", "+++ ")):
            path = _unquote(line[4:].split("\t")[0])
            if path != "/dev/null":
                paths.add(_strip_prefix(path))
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.add(_unquote(line.split(" ", 2)[2]))
        elif line.startswith("@@") or line.startswith(("+", "-", " ")) and not line.startswith(("+++", "---")):
            break  # the header is over
    return {p for p in paths if p}


def _git_header_paths(rest: str) -> set[str]:
    if rest.startswith('"'):
        first, _, second = rest[1:].partition('" ')
        return {_strip_prefix(_unquote('"' + first + '"')), _strip_prefix(_unquote(second))}
    if rest.endswith('"'):
        first, _, second = rest.rpartition(' "')
        return {_strip_prefix(first), _strip_prefix(_unquote('"' + second))}
    half = (len(rest) - 1) // 2  # "a/X b/X": same length on both sides when the path is not renamed
    if rest[half] == " " and rest[2:half] == rest[half + 3:]:
        return {rest[2:half]}
    return {_strip_prefix(p) for p in rest.split(" ")}  # a rename: the rename lines name it exactly too


def _strip_prefix(path: str) -> str:
    return path[2:] if path[:2] in ("a/", "b/") else path


def _unquote(text: str) -> str:
    """git's C-style quoted path ("a/t\\303\\251st.py") as text."""
    if len(text) < 2 or not (text.startswith('"') and text.endswith('"')):
        return text
    raw = text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


# Runs in the scoring sandbox (python3 -I -S), in the project folder, after the patches and before pytest:
# argv[1] the read-only original tree, argv[2] a file with the JSON list of the original's files, argv[3] a file
# with this module's source (so the rule is the host's own `protected`); files, not arguments: a tree's list
# can pass the kernel's 128 KB limit on one argument. Only files and symbolic links are removed: a folder of
# the original stays, its new protected files go one by one.
SWEEP = r"""
import json, os, shutil, sys
original_root = sys.argv[1]
with open(sys.argv[2], encoding="utf-8") as listing:
    original = frozenset(json.load(listing))
rules = {}
with open(sys.argv[3], encoding="utf-8") as source:
    exec(compile(source.read(), "omrl-guard", "exec"), rules)
protected = rules["protected"]
keep = sorted(p for p in original if protected(p))
for path in sorted({os.path.dirname(p) for p in keep}, key=len):  # a folder swapped for a link: the link goes
    while path and not os.path.islink(os.path.join(original_root, path)):
        if os.path.islink(path):
            os.remove(path)
            print("OMRL: removed", path)
        path = os.path.dirname(path)
for top, folders, files in os.walk(".", topdown=True):
    for name in list(folders) + files:
        path = os.path.normpath(os.path.join(top, name))
        entry_is_folder = os.path.isdir(path) and not os.path.islink(path)
        if path.startswith(".omrl-") or entry_is_folder or path in original or not protected(path, original):
            continue
        os.remove(path)
        print("OMRL: removed", path)
        if name in folders:
            folders.remove(name)
for path in keep:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    shutil.copy2(os.path.join(original_root, path), path, follow_symlinks=False)
"""


def tree_files(root: str | PathLike[str]) -> list[str]:
    """Every file and symbolic link under `root`, as sorted relative POSIX paths (folders left out)."""
    found = []
    for top, folders, files in os.walk(root):
        for name in files + [f for f in folders if os.path.islink(os.path.join(top, f))]:
            found.append(PurePosixPath(os.path.relpath(os.path.join(top, name), root)).as_posix())
    return sorted(found)
