"""omrl.store.splice: a compaction of parts with row groups of a useful size copies their pages under one new
footer; the merged part reads back exactly (checksums verified, pyarrow, DuckDB, `datasets`), keeps its side
data and search index right, and parts that cannot be spliced are encoded again."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from conftest import make_trajectory

from omrl.schema import SCHEMAS
from omrl.store import Store
from omrl.store import layout as store_layout
from omrl.store import search as S
from omrl.store.layout import CompactPolicy
from omrl.store.parts import LISTED_KEY, REPLACES_KEY
from omrl.store.splice import Footer, ThriftError, read_struct, spliceable, write_struct


def _rows(n: int, start: int = 0) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        row = make_trajectory(i).to_row()
        row["messages"][0]["content"] = f"segfault {i} " + "word " * 400  # about 2 KB of text a row
        rows.append(row)
    return rows


@pytest.fixture
def parted(tmp_path, monkeypatch) -> Store:
    """Three parts of several 8 KB row groups each (a small target, so the test stays small)."""
    monkeypatch.setattr(store_layout, "ROW_GROUP_BYTES", 8 * 1024)
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=0))
    for start in (0, 30, 60):
        store.append(_rows(30, start))
    return store


def _groups(part) -> list[int]:
    meta = pq.read_metadata(part)
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def test_a_footer_reads_and_writes_back_byte_for_byte(parted):
    data = parted.parts()[0].read_bytes()
    footer = Footer(data)
    out = bytearray()
    write_struct(out, footer.fields)
    assert bytes(out) == data[footer.data_end:-8]
    whole, _ = read_struct(data[footer.data_end:-8])  # decoding every field gives the same bytes too
    again = bytearray()
    write_struct(again, whole)
    assert bytes(again) == bytes(out)
    with pytest.raises(ThriftError, match="not a Parquet file"):
        Footer(b"PAR1 not really")


def test_a_spliced_compaction_reads_back_exactly(parted, monkeypatch):
    parts = parted.parts()
    before = parted.read()
    tool_calls = parted.sql("SELECT * FROM tool_calls ORDER BY trajectory_id, message_position, call_index")
    groups = [g for p in parts for g in _groups(p)]
    assert len(groups) > 6
    merged = parted.compact()
    assert _groups(merged) == groups  # the parts' row groups, copied
    assert pq.read_table(merged, page_checksum_verification=True).equals(before)
    assert parted.read().equals(before)
    assert parted.sql("SELECT * FROM tool_calls ORDER BY trajectory_id, message_position, call_index").equals(tool_calls)
    assert parted.sql("SELECT count(*) AS n, count(DISTINCT id) AS d FROM trajectories").to_pylist() == [{"n": 90, "d": 90}]
    keys = pq.read_metadata(merged).metadata
    assert json.loads(keys[REPLACES_KEY]) == sorted(p.name for p in parts)
    assert keys[LISTED_KEY] == parted.manifest["store_id"].encode()
    assert pq.read_schema(merged).equals(SCHEMAS["trajectories"], check_metadata=False)
    assert parted.check() == []
    side = parted.side_files()
    assert side[1] == [] and len(side[0]) == 1  # its side file matches it
    assert S.search_ids(parted, "segfault").to_pylist() == sorted(before.column("id").to_pylist())
    assert len(S.search(parted, "segfault")) == len(S.search(parted, "segfault", use_index=False)) == 90

    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    ds = datasets.load_dataset(str(parted.path), "trajectories", split="train")
    assert sorted(ds["id"]) == sorted(before.column("id").to_pylist())


def test_parts_that_cannot_be_spliced_are_encoded_again(parted, tmp_path):
    footers = [Footer(p.read_bytes()) for p in parted.parts()]
    assert spliceable(footers, SCHEMAS["trajectories"], 1)
    assert not spliceable(footers, SCHEMAS["trajectories"], 1 << 30)  # row groups too small for this target
    assert not spliceable(footers, SCHEMAS["annotations"], 1)  # another schema
    # a part of another layout (no Arrow schema in its footer, one big row group): merged by encoding it again
    other = Store.create(tmp_path / "other")
    other.set_compact_policy(CompactPolicy(small_parts=0))
    other.append(_rows(30))
    foreign = other.table_dir("trajectories") / parted.parts()[1].name.replace("part-", "part-0")
    pq.write_table(pq.read_table(parted.parts()[1]), foreign, store_schema=False)  # rows 30-59
    other.repair()
    assert len(other.parts()) == 2
    expected = other.read().sort_by("id")
    merged = other.compact()
    assert other.read().sort_by("id").equals(expected)
    assert _groups(merged) == store_layout.row_group_sizes(pq.read_table(merged))
