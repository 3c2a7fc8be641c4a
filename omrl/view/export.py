"""`omrl view --export DIR`: the viewer's pages as static HTML files with relative links.

Layout: index.html (the selection's list), runs.html, t/<key>.html per trajectory, g/<key>.html per
group of a selected trajectory, static/ (the same CSS and JS). Keys are hashes of the ids, so any id makes
a safe file name. Links to trajectories outside the selection are left as plain text.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from omrl.errors import OmrlError
from omrl.store import Store
from omrl.view import pages
from omrl.view.data import ListPage, StoreReader

DEFAULT_LIMIT = 1000
STATIC_DIR = Path(__file__).parent / "static"


@dataclass
class Exported:
    trajectories: int
    groups: int
    index: Path


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def export_site(store: Store, out: str | os.PathLike[str], where: str | None = None,
                limit: int = DEFAULT_LIMIT) -> Exported:
    """Write the pages of the trajectories matching `where` (newest first, at most `limit`) under `out`."""
    if limit < 1:
        raise OmrlError(f"--limit must be at least 1, not {limit}")
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise OmrlError(f"{root} exists and is not a folder")
    reader = StoreReader(store)
    name = store.path.resolve().name
    try:
        ids = reader.selected_ids(where, limit)
        rows = reader.list_rows(ids)
        groups = sorted({r["group_id"] for r in rows if r.get("group_id")})
        links = pages.Links(export=True, trajectories=set(ids), groups=set(groups))
        top, deep = links.at_depth(0), links.at_depth(1)
        root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(STATIC_DIR, root / "static", dirs_exist_ok=True)
        listing = ListPage(rows, len(rows), 1, 1, "created", True, (where or "").strip())
        _write(root / "index.html", pages.list_html(listing, top, name))
        _write(root / "runs.html", pages.runs_html(reader.runs(), top, name))
        notes = reader.annotations(ids)
        for tid in reader.storage_order(ids):
            row = reader.trajectory(tid, annotations=notes[tid])
            if row is not None:
                _write(root / "t" / f"{pages.file_key(tid)}.html", pages.trajectory_html(row, deep, name))
        first_member = {}
        for r in rows:
            first_member.setdefault(r.get("group_id"), r["id"])
        members = reader.storage_order([first_member[g] for g in groups])
        by_member = {first_member[g]: g for g in groups}
        for gid in (by_member[m] for m in members):
            group = reader.group(gid)
            if group is not None:
                _write(root / "g" / f"{pages.file_key(gid)}.html", pages.group_html(group, deep, name))
    finally:
        reader.close()
    return Exported(len(ids), len(groups), root / "index.html")
