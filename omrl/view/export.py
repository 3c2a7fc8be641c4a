"""`omrl view --export DIR`: the viewer's pages as static HTML files with relative links.

Layout: index.html and page-2.html, page-3.html, ... (the selection's list, `per_page` rows a page, with
first/prev/next/last links), runs.html, t/<key>.html per trajectory, g/<key>.html per
group of a selected trajectory, t/<key>-<field>-at<N>.html per text a page cuts (longer than
pages.CUT_CHARS), static/ (the same CSS and JS). Keys are hashes of the ids, so any id makes a safe file
name. Links to trajectories outside the selection are left as plain text.

The folder is written whole: staged beside it and renamed into place. A non-empty folder is replaced only
with `overwrite`, and never a store, a folder inside one or a folder holding one.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from omrl.errors import OmrlError, UsageError
from omrl.store import MANIFEST, Store
from omrl.store.durable import staged_folder
from omrl.store.query_limits import QueryError
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


def _refuse_unsafe(root: Path, overwrite: bool) -> None:
    """An export replaces `root` whole: refuse a file, a store (or a folder in one or holding one) and,
    without `overwrite`, a non-empty folder."""
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root} exists and is not a folder")
    here = root.resolve()
    for folder in (here, *here.parents):
        if (folder / MANIFEST).is_file():
            where = "is" if folder == here else f"is inside the store {folder}; that"
            raise UsageError(f"--export {root} {where} a store: the export would replace its files; "
                             "give a folder outside any store")
    if not root.is_dir() or not any(root.iterdir()):
        return
    if not overwrite:
        raise UsageError(f"--export {root} is not empty; give a new or empty folder, or --overwrite to replace "
                         "it (an earlier export) whole")
    for folder, _dirs, files in os.walk(root):
        if MANIFEST in files:
            raise UsageError(f"--export {root} holds the store {folder}: --overwrite would delete it; give "
                             "another folder")


def export_site(store: Store, out: str | os.PathLike[str], where: str | None = None,
                limit: int = DEFAULT_LIMIT, per_page: int = DEFAULT_PER_PAGE, search: str | None = None,
                overwrite: bool = False) -> Exported:
    """Write the pages of the trajectories matching `where` and the text `search` (exactly the viewer's
    list for them, newest first, at most `limit`) as the folder `out`, the list `per_page` rows a file.
    A non-empty `out` is replaced only with `overwrite` (never a store's folder or one holding a store)."""
    if limit < 1:
        raise OmrlError(f"--limit must be at least 1, not {limit}")
    if per_page < 1:
        raise OmrlError(f"--per-page must be at least 1, not {per_page}")
    root = Path(out)
    _refuse_unsafe(root, overwrite)
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
        with staged_folder(root) as folder:
            shutil.copytree(STATIC_DIR, folder / "static")
            selection, text = (where or "").strip(), (search or "").strip()
            count = max(1, math.ceil(len(rows) / per_page))
            for number in range(1, count + 1):
                chunk = rows[(number - 1) * per_page: number * per_page]
                listing = ListPage(chunk, len(rows), number, count, "created", True, selection, search=text,
                                   matched=matched)
                _write(folder / Path(top.home(page=number)).name, pages.list_html(listing, top, name))
            _write(folder / "runs.html", pages.runs_html(reader.runs(), top, name, store.path))
            notes = reader.annotations(ids)
            for tid in reader.storage_order(ids):
                row = reader.trajectory(tid, annotations=notes[tid])
                if row is None:
                    continue
                _write(folder / "t" / f"{pages.file_key(tid)}.html", pages.trajectory_html(row, deep, name))
                for address in pages.long_texts(row):  # the whole of each text the page cuts
                    _write(folder / "t" / f"{pages.full_text_key(tid, *address)}.html",
                           pages.full_text_html(row, *address, deep, name))
            first_member = {}
            for r in rows:
                first_member.setdefault(r.get("group_id"), r["id"])
            members = reader.storage_order([first_member[g] for g in groups])
            by_member = {first_member[g]: g for g in groups}
            for gid in (by_member[m] for m in members):
                group = reader.group(gid)
                if group is not None:
                    _write(folder / "g" / f"{pages.file_key(gid)}.html", pages.group_html(group, deep, name))
    finally:
        reader.close()
    return Exported(len(ids), len(groups), root / "index.html", count, matched)
