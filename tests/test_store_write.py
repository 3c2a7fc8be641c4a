"""The store's write path: row groups sized by bytes (appends and compactions), statistics only where
readers prune with them, and rows read back exactly as written."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_trajectory

from omrl.schema.arrow import to_table
from omrl.store import Store
from omrl.store import layout as store_layout
from omrl.store.layout import CompactPolicy, row_bytes, row_group_sizes, side_path, write_parquet


def _text_bytes(row: dict) -> int:
    """Message text bytes of one row, counted by hand (content, reasoning, tool-call arguments)."""
    total = 0
    for m in row["messages"]:
        total += len((m.get("content") or "").encode()) + len((m.get("reasoning") or "").encode())
        total += sum(len(c["arguments"].encode()) for c in m.get("tool_calls") or [])
    return total


def _rows(sizes: list[int], start: int = 0) -> list[dict]:
    rows = []
    for i, size in enumerate(sizes):
        row = make_trajectory(start + i).to_row()
        row["messages"][0]["content"] = "é" * (size // 2)  # two bytes a character: bytes, not characters
        row["messages"][0]["reasoning"] = "r" * (i % 7)
        rows.append(row)
    return rows


def test_row_bytes_count_message_text_exactly_on_chunked_and_sliced_tables():
    rows = _rows([100, 5000, 0, 70_000, 12, 3000])
    table = pa.concat_tables([to_table(rows[:2]), to_table(rows[2:])]).slice(1)  # two chunks, an offset
    got = row_bytes(table)
    text = [_text_bytes(r) for r in rows[1:]]
    assert len(got) == len(text) == table.num_rows
    # the other columns add the same average to every row: differences are the text's alone
    assert [int(g - got[0]) for g in got] == [t - text[0] for t in text]
    assert got[0] >= text[0] and int(got.sum()) <= table.nbytes + len(got)


@pytest.mark.parametrize("sizes", [[40_000] * 50, [10] * 300, [1000, 900_000, 5, 5, 300_000, 2000] * 4, [0]])
def test_row_groups_hold_about_the_target_bytes(sizes):
    table = to_table(_rows(sizes))
    target = 256 * 1024
    groups = row_group_sizes(table, target)
    assert sum(groups) == table.num_rows and all(g > 0 for g in groups)
    per_row = row_bytes(table).tolist()
    start = 0
    for g in groups:
        assert sum(per_row[start:start + g - 1]) < target  # a group crosses the target only by its last row
        start += g
    assert len(groups) <= max(1, math.ceil(sum(per_row) / target))


def test_row_groups_never_exceed_the_row_cap(monkeypatch):
    monkeypatch.setattr(store_layout, "MAX_ROW_GROUP_ROWS", 7)
    table = to_table(_rows([10] * 30))
    assert row_group_sizes(table, 1 << 30) == [7, 7, 7, 7, 2]


def test_appends_and_compactions_cut_row_groups_by_bytes_and_read_back_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(store_layout, "ROW_GROUP_BYTES", 64 * 1024)
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=0))
    first, second = _rows([20_000] * 12), _rows([3000, 150_000, 3000, 3000] * 3, start=100)
    for rows in (first, second):
        part = store.append(rows).part
        meta = pq.read_metadata(part)
        expected = row_group_sizes(pq.read_table(part))
        assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == expected
        assert len(expected) > 2
    expected = to_table(first + second)
    assert store.read().sort_by("id").equals(expected.sort_by("id"))
    groups = [_group_rows(part) for part in store.parts()]
    merged = store.compact()
    assert _group_rows(merged) == groups[0] + groups[1]  # groups of a useful size: spliced as they are
    assert store.read().sort_by("id").equals(expected.sort_by("id"))


def _group_rows(part) -> list[int]:
    meta = pq.read_metadata(part)
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def test_compacting_small_appends_cuts_row_groups_by_bytes_again(tmp_path, monkeypatch):
    monkeypatch.setattr(store_layout, "ROW_GROUP_BYTES", 64 * 1024)
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=0))
    rows = _rows([3000] * 40)
    for i in range(0, 40, 4):  # ten parts of one small row group each: below a quarter of the target
        store.append(rows[i:i + 4])
    merged = store.compact()
    assert _group_rows(merged) == row_group_sizes(pq.read_table(merged)) and len(_group_rows(merged)) < 10
    assert store.read().sort_by("id").equals(to_table(rows).sort_by("id"))


def test_statistics_are_written_for_top_level_columns_only(tmp_path):
    store = Store.create(tmp_path / "s")
    part = store.append([make_trajectory(i).to_row() for i in range(20)]).part
    group = pq.read_metadata(part).row_group(0)
    stats = {group.column(i).path_in_schema: group.column(i).is_stats_set for i in range(group.num_columns)}
    assert stats["id"] and stats["reward"] and stats["round"] and stats["created_at"]
    assert not stats["messages.list.element.content"] and not stats["turns.list.element.reward"]
    # DuckDB still prunes by them: a filter on id answers from the part
    assert store.sql("SELECT count(*) AS n FROM trajectories WHERE id = 'traj-3'").column("n")[0].as_py() == 1


def test_an_empty_table_and_a_part_without_tool_calls_are_readable(tmp_path):
    empty = to_table([])
    write_parquet(empty, tmp_path / "empty.parquet")
    assert pq.read_table(tmp_path / "empty.parquet").schema.equals(empty.schema)
    store = Store.create(tmp_path / "s")
    row = make_trajectory(0).to_row()
    for m in row["messages"]:
        m["tool_calls"] = []
    part = store.append([row]).part
    assert pq.read_table(side_path(part)).num_rows == 0
    assert store.side_files() == ([side_path(part)], [])
    assert store.sql("SELECT count(*) AS n FROM tool_calls").column("n")[0].as_py() == 0
