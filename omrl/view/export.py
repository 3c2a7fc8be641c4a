"""`omrl view --export DIR`: the viewer's pages as static HTML files with relative links.

Layout: index.html and page-2.html, page-3.html, ... (the selection's list, `per_page` rows a page, with
first/prev/next/last links), runs.html, t/<key>.html per trajectory, g/<key>.html per
group of a selected trajectory, static/ (the same CSS and JS). Keys are hashes of the ids, so any id makes
a safe file name. Links to trajectories outside the selection are left as plain text.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from omrl.errors import OmrlError, UsageError
from omrl.query import QueryError
from omrl.store import Store
from omrl.view import pages
from omrl.view.data import ListPage, StoreReader

DEFAULT_LIMIT = 1000
DEFAULT_PER_PAGE = 100
STATIC_DIR = Path(__file__).parent / "static"


@dataclass
class Exported:
    trajectories: int
    groups: int
    index: Path
    pages: int = 1  # list files: index.html, page-2.html, ...
    matched: int = 0  # trajectories the selection matched (more than written when the limit cut it)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def export_site(store: Store, out: str | os.PathLike[str], where: str | None = None,
                limit: int = DEFAULT_LIMIT, per_page: int = DEFAULT_PER_PAGE, search: str | None = None
                ) -> Exported:
    """Write the pages of the trajectories matching `where` and the text `search` (exactly the viewer's
    list for them, newest first, at most `limit`) under `out`, the list `per_page` rows a file."""
    if limit < 1:
        raise OmrlError(f"--limit must be at least 1, not {limit}")
    if per_page < 1:
        raise OmrlError(f"--per-page must be at least 1, not {per_page}")
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise OmrlError(f"{root} exists and is not a folder")
    reader = StoreReader(store)
    name = store.path.resolve().name
    try:
        try:
            rows, matched = reader.selection(where, search, limit)
        except (QueryError, UsageError) as exc:  # the message names the problem; say which option
            raise UsageError(f"--{'where' if isinstance(exc, QueryError) else 'search'}: {exc}") from None
        ids = [r["id"] for r in rows]
        groups = sorted({r["group_id"] for r in rows if r.get("group_id")})
        links = pages.Links(export=True, trajectories=set(ids), groups=set(groups))
        top, deep = links.at_depth(0), links.at_depth(1)
        root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(STATIC_DIR, root / "static", dirs_exist_ok=True)
        selection, text = (where or "").strip(), (search or "").strip()
        count = max(1, math.ceil(len(rows) / per_page))
        for stale in root.glob("page-*.html"):  # a re-export with fewer pages must not leave old ones linked
            stale.unlink()
        for number in range(1, count + 1):
            chunk = rows[(number - 1) * per_page: number * per_page]
            listing = ListPage(chunk, len(rows), number, count, "created", True, selection, search=text,
                               matched=matched)
            _write(root / Path(top.home(page=number)).name, pages.list_html(listing, top, name))
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
    return Exported(len(ids), len(groups), root / "index.html", count, matched)
