"""The store: layout, atomic appends, corrupt parts, compaction, old schemas, concurrency, HF loading."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_trajectory

from omrl.schema import normalize_trajectory
from omrl.store import CorruptPartWarning, Store, StoreError


def test_layout_is_a_dataset_folder(tmp_path):
    store = Store.create(tmp_path / "s")
    assert (store.path / "omrl.json").is_file()
    assert (store.path / "data" / "trajectories").is_dir()
    assert (store.path / "data" / "annotations").is_dir()
    card = (store.path / "README.md").read_text()
    assert "config_name: trajectories" in card and "data/trajectories/part-*.parquet" in card
    assert store.manifest["schema_version"] == 2


def test_opening_a_missing_store_says_how_to_create_one(tmp_path):
    with pytest.raises(StoreError, match="not an omrl store"):
        Store(tmp_path / "nope")


def test_create_refuses_a_foreign_non_empty_folder(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "x.txt").write_text("mine")
    with pytest.raises(StoreError, match="not empty"):
        Store.create(tmp_path / "f")


def test_append_writes_one_part_and_no_temp_files(store):
    folder = store.path / "data" / "trajectories"
    files = [f for f in folder.iterdir() if f.is_file()]
    assert [f.suffix for f in files] == [".parquet"]
    part = files[0]
    # beside it only its side data (appends build no search index; compaction does), none of them a temporary
    assert sorted(f.name for f in folder.iterdir() if f.is_dir()) == [".side"]
    assert [f.name for f in (folder / ".side").iterdir()] == [f"{part.stem}.tool_calls.parquet"]
    assert store.count() == 6


def test_append_rejects_invalid_rows_and_writes_nothing(store):
    before = store.parts()
    with pytest.raises(Exception, match="field 'reward'"):
        store.append([make_trajectory(10).to_row(), {"id": "bad", "task_id": "t", "reward": "x"}])
    assert store.parts() == before


def test_an_unreadable_file_among_the_parts_is_not_read_and_check_names_it(store):
    bad = store.path / "data" / "trajectories" / "part-99999999T000000000000-1-deadbeef.parquet"
    good = store.parts()[0].read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # a truncated write from a crashed tool, not listed in omrl.json
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # readers read the listed parts only: nothing to skip or warn about
        assert store.read().num_rows == 6
        assert store.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 6}]
        assert store.sql("SELECT count(*) AS n FROM messages").to_pylist() == [{"n": 36}]
    problems = store.check()
    assert [p.path.name for p in problems] == [bad.name] and "unreadable" in problems[0].error


def test_a_store_without_a_listing_skips_an_unreadable_part_with_a_warning(tmp_path):
    shutil.copytree(Path(__file__).parent / "fixtures" / "store_v1", tmp_path / "v1")
    store = Store(tmp_path / "v1")
    rows = store.count()
    bad = store.path / "data" / "trajectories" / "part-99999999T000000000000-1-deadbeef.parquet"
    bad.write_bytes(store.parts()[0].read_bytes()[:500])
    with pytest.warns(CorruptPartWarning, match=bad.name):
        assert store.read().num_rows == rows
    assert [p.path.name for p in store.check()] == [bad.name]


def test_check_finds_parts_whose_pages_are_damaged(store):
    path = store.parts()[0]
    data = bytearray(path.read_bytes())
    data[8:200] = b"\x00" * 192  # footer intact, first data pages destroyed
    path.write_bytes(bytes(data))
    assert [p.path for p in store.check()] == [path]


def test_compaction_keeps_rows_and_survives_a_crash_before_cleanup(tmp_path):
    store = Store.create(tmp_path / "s")
    for i in range(5):
        store.append([make_trajectory(i).to_row()])
    ids = sorted(store.ids())
    old_parts = store.parts()
    # Simulate a crash after the compacted part was renamed in but before the old parts were removed.
    saved = {p: p.read_bytes() for p in old_parts}
    new = store.compact()
    for path, data in saved.items():
        path.write_bytes(data)
    assert len(store._all_parts("trajectories")) == 6
    assert store.parts() == [new]
    assert sorted(store.read().column("id").to_pylist()) == ids
    assert store.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 5}]


def test_a_later_compaction_removes_a_crashed_compactions_leftovers(tmp_path):
    store = Store.create(tmp_path / "s")
    for i in range(3):
        store.append([make_trajectory(i).to_row()])
    saved = {p: p.read_bytes() for p in store.parts()}
    store.compact()
    for path, data in saved.items():  # a crash before cleanup leaves the inputs behind
        path.write_bytes(data)
    store.append([make_trajectory(3).to_row()])
    new = store.compact()
    # The leftovers must not come back once the part that hid them is compacted away.
    assert store._all_parts("trajectories") == [new]
    assert store.count() == 4
    assert len(store.ids()) == 4


READERS = {"read": lambda s: s.read().num_rows, "ids": lambda s: len(s.ids()), "count": lambda s: s.count()}


# The race while listing parts (footers not yet read), or while reading them (footers cached; count reads none).
@pytest.mark.parametrize(("reader", "footers_cached"),
                         [("read", False), ("ids", False), ("count", False), ("read", True), ("ids", True)])
def test_a_reader_racing_a_compaction_still_sees_every_row(tmp_path, monkeypatch, reader, footers_cached):
    store = Store.create(tmp_path / "s")
    for i in range(4):
        store.append([make_trajectory(i).to_row()])
    store = Store(store.path)  # a reader that has not listed the parts yet (appends list them)
    if footers_cached:
        store.parts()
    real_read_metadata, real_read_table = pq.read_metadata, pq.read_table
    compacted = []

    def compact_first(real):
        def reader(*args, **kwargs):
            if not compacted:  # another process compacts after our listing of the parts, before we read them
                compacted.append(True)
                Store(store.path).compact()
            return real(*args, **kwargs)
        return reader

    monkeypatch.setattr("omrl.store.parts.pq.read_metadata", compact_first(real_read_metadata))
    monkeypatch.setattr("omrl.store.parts.pq.read_table", compact_first(real_read_table))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no part may be skipped as unreadable
        assert READERS[reader](store) == 4
    assert compacted and len(store.parts()) == 1


def test_append_to_an_unknown_table_names_the_tables(store):
    with pytest.raises(StoreError, match="unknown table 'trajectory'; tables are trajectories, annotations"):
        store.append([make_trajectory(10).to_row()], table="trajectory")


def test_older_schema_parts_stay_readable(store):
    old_turn = pa.struct([("index", pa.int32()), ("reward", pa.float64()), ("done", pa.bool_())])
    old = pa.table({
        "id": ["old-1"], "task_id": ["task-0"], "reward": [0.5],
        "turns": pa.array([[{"index": 0, "reward": 0.5, "done": True}]], pa.list_(old_turn)),
    })
    old_part = store.path / "data" / "trajectories" / "part-00000000T000000000000-0-0ld.parquet"
    pq.write_table(old, old_part)  # as an older omrl wrote it: not in the listing until a repair adds it
    assert store.repair().adopted == [str(old_part)]
    rows = {r["id"]: r for r in store.read().to_pylist()}
    assert rows["old-1"]["reward"] == 0.5 and rows["old-1"]["metadata"] is None
    assert rows["old-1"]["turns"][0]["logprobs"] is None
    result = store.sql("SELECT id, env, turns[1].done AS done FROM trajectories WHERE id = 'old-1'").to_pylist()
    assert result == [{"id": "old-1", "env": None, "done": True}]


def test_a_store_of_only_old_parts_still_has_every_column(tmp_path):
    store = Store.create(tmp_path / "s")
    pq.write_table(pa.table({"id": ["a"], "task_id": ["t"]}), store.path / "data" / "trajectories" / "part-0.parquet")
    store.repair()  # adds the old part to the listing
    assert store.sql("SELECT id, metadata, messages FROM trajectories").to_pylist() == [
        {"id": "a", "metadata": None, "messages": None}]


APPENDER = textwrap.dedent(
    """
    import sys
    from omrl.store import Store
    store = Store(sys.argv[1])
    tag = sys.argv[2]
    for batch in range(20):
        store.append([{"id": f"{tag}-{batch}-{i}", "task_id": f"t{i}"} for i in range(50)])
    """
)


def test_two_processes_appending_lose_nothing(tmp_path):
    store = Store.create(tmp_path / "s")
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(store.path), tag]) for tag in ("a", "b")]
    compactions = 0
    while any(p.poll() is None for p in procs):  # compact while the writers are busy
        if store.compact(min_parts=3):
            compactions += 1
    assert [p.wait() for p in procs] == [0, 0]
    assert store.count() == 2000
    assert len(store.ids()) == 2000
    assert store.sql("SELECT count(DISTINCT id) AS n FROM trajectories").to_pylist() == [{"n": 2000}]
    assert store.check() == []


def test_load_dataset_reads_the_store_offline(store, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    ds = datasets.load_dataset(str(store.path), "trajectories", split="train")
    assert len(ds) == 6
    assert sorted(ds["id"]) == sorted(store.ids())
    assert ds[0]["messages"][2]["tool_calls"][0]["name"] == "calculator"


def test_update_manifest_appends_lineage(store):
    store.update_manifest(lineage={"source": "a"})
    store.update_manifest(lineage={"source": "b"}, note="x")
    manifest = store.manifest
    assert [entry["source"] for entry in manifest["lineage"]] == ["a", "b"]
    assert manifest["note"] == "x"


def test_appending_an_arrow_table_conforms_it(tmp_path):
    store = Store.create(tmp_path / "s")
    row = normalize_trajectory(make_trajectory(1).to_row())
    table = pa.Table.from_pylist([row]).drop_columns(["metadata"])
    store.append(table)
    assert store.read().to_pylist()[0]["messages"] == row["messages"]


def test_store_auto_compact_cli_shows_changes_and_refuses_settings(tmp_path):
    from click.testing import CliRunner

    from omrl.cli.main import cli
    from omrl.store.layout import CompactPolicy

    Store.create(tmp_path / "s")
    runner = CliRunner()
    shown = runner.invoke(cli, ["store", "auto-compact", str(tmp_path / "s")])
    assert shown.exit_code == 0 and "once 32 parts under 16 MB" in shown.output
    changed = runner.invoke(cli, ["store", "auto-compact", str(tmp_path / "s"), "--parts", "4", "--part-mb", "2"])
    assert changed.exit_code == 0, changed.output
    assert Store(tmp_path / "s").compact_policy == CompactPolicy(small_parts=4, small_part_bytes=2 * 1024 * 1024)
    refused = runner.invoke(cli, ["store", "auto-compact", str(tmp_path / "s"), "--parts", "1"])
    assert refused.exit_code == 2 and "at least 2" in refused.output
    assert Store(tmp_path / "s").compact_policy.small_parts == 4
