"""Store layout v2: v1 stores still work, flat side data equals unnesting, automatic compaction is crash-safe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_trajectory

from omrl.schema import SCHEMA_VERSION, Message, ToolCall, Trajectory
from omrl.store import AutoCompactWarning, SearchIndexWarning, Store, StoreError
from omrl.store.layout import DICTIONARY_PAGE_BYTES, CompactPolicy, side_path
from tests.cases.chaos import observe_trajectories

FIXTURE = Path(__file__).parent / "fixtures" / "store_v1"
TOOL_CALLS = "SELECT * FROM tool_calls ORDER BY trajectory_id, message_position, call_index"
OFF = CompactPolicy(small_parts=0)


def v1_store(tmp_path: Path) -> Store:
    """A copy of the committed v1 fixture (written by the code before v2), safe to change."""
    shutil.copytree(FIXTURE, tmp_path / "v1")
    return Store(tmp_path / "v1")


def unnested(store: Store, sql: str = TOOL_CALLS):
    """`sql` on a copy of the store without side data: the tool_calls view unnests every part."""
    copy = store.path.parent / f"{store.path.name}-unnested"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store.path, copy)
    shutil.rmtree(copy / "data" / "trajectories" / ".side", ignore_errors=True)
    other = Store(copy)
    assert other.side_files()[0] == []
    return other.sql(sql)


def varied_rows(start: int = 0) -> list[dict]:
    """Trajectories with no messages, messages without calls, and several calls in one message."""
    many = Trajectory(id=f"many-{start}", task_id="t-many", env="code", messages=[
        Message("user", "go"),
        Message("assistant", None, tool_calls=[ToolCall("ls", "{}", "a"), ToolCall("cat", '{"f": "x"}', "b"),
                                               ToolCall("grep", '{"p": "y"}', "c")]),
        Message("tool", "x", tool_call_id="a", name="ls"),
        Message("assistant", "done")])
    rows = [many.to_row(), Trajectory(id=f"empty-{start}", task_id="t-empty").to_row(),
            Trajectory(id=f"chat-{start}", task_id="t-chat", messages=[Message("user", "hi"),
                                                                        Message("assistant", "hello")]).to_row()]
    return rows + [make_trajectory(i).to_row() for i in range(start, start + 5)]


# ---------------------------------------------------------------- version 1 stores


def test_the_v1_fixture_is_read_and_queried_as_written(tmp_path):
    store = v1_store(tmp_path)
    assert store.manifest["schema_version"] == 1
    assert store.count() == 6 and len(store.parts()) == 2
    table = store.read()
    assert sorted(table.column("id").to_pylist()) == [f"traj-{i}" for i in range(6)]
    assert table.column("messages").to_pylist()[0][2]["tool_calls"][0]["name"] == "calculator"
    assert store.side_files() == ([], store.parts())  # v1 parts have no side data: they are unnested
    calls = store.sql("SELECT name, count(*) AS n FROM tool_calls GROUP BY name ORDER BY name").to_pylist()
    assert calls == [{"name": "answer", "n": 6}, {"name": "calculator", "n": 6}]
    assert store.sql("SELECT count(*) AS n FROM messages").to_pylist() == [{"n": 36}]
    assert store.sql("SELECT count(*) AS n FROM annotations").to_pylist() == [{"n": 3}]
    assert store.check() == []


def test_the_v1_fixture_loads_with_hugging_face_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    store = v1_store(tmp_path)
    loaded = datasets.load_dataset(str(store.path), "trajectories", split="train")
    assert sorted(loaded["id"]) == [f"traj-{i}" for i in range(6)]


def test_a_v1_store_takes_v2_appends_and_mixed_parts_query_as_one(tmp_path):
    store = v1_store(tmp_path)
    store.append(varied_rows(10))
    assert store.manifest["schema_version"] == SCHEMA_VERSION == 2
    sides, lacking = store.side_files()
    assert len(sides) == 1 and len(lacking) == 2  # the new part has side data, the v1 parts do not
    mixed = store.sql(TOOL_CALLS)
    assert mixed.num_rows == 12 + 3 + 10
    assert mixed.equals(unnested(store))
    datasets = pytest.importorskip("datasets")
    assert len(datasets.load_dataset(str(store.path), "trajectories", split="train")) == 6 + 8


def test_a_v1_store_compacts_into_a_v2_part_with_the_same_rows(tmp_path):
    store = v1_store(tmp_path)
    before = store.read().sort_by("id")
    calls = store.sql(TOOL_CALLS)
    merged = store.compact()
    assert merged is not None and store.parts() == [merged]
    assert store.read().sort_by("id").equals(before)
    assert store.side_files() == ([side_path(merged)], [])
    assert store.sql(TOOL_CALLS).equals(calls)
    assert store.check() == []


# ---------------------------------------------------------------- side data


def test_tool_calls_from_side_data_equal_unnesting_the_parts(tmp_path):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(OFF)
    store.append(varied_rows(0))
    store.append(varied_rows(100))
    assert len(store.side_files()[0]) == 2
    flat = store.sql(TOOL_CALLS)
    assert flat.num_rows == 2 * (3 + 10)
    assert flat.equals(unnested(store))
    grouped = "SELECT name, count(*) AS n, max(call_index) AS k FROM tool_calls GROUP BY name ORDER BY name"
    assert store.sql(grouped).equals(unnested(store, grouped))


def test_a_damaged_or_foreign_side_file_is_ignored_and_the_part_unnested(tmp_path):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(OFF)
    store.append(varied_rows(0))
    store.append(varied_rows(100))
    expected = store.sql(TOOL_CALLS)
    first, second = store.parts()
    side_path(first).write_bytes(b"not parquet at all")  # a damaged side file
    fresh = Store(store.path)
    with pytest.warns(UserWarning, match="side file"):
        sides, lacking = fresh.side_files()
    assert lacking == [first] and sides == [side_path(second)]
    assert fresh.sql(TOOL_CALLS).equals(expected)
    # a side file of another part (same row count) does not match: its stamp names the other part
    shutil.copy(side_path(second), side_path(first))
    assert Store(store.path).side_files() == ([side_path(second)], [first])
    assert Store(store.path).sql(TOOL_CALLS).equals(expected)


def test_the_next_writer_removes_side_files_whose_part_never_landed(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append(varied_rows(0))
    part = store.parts()[0]
    orphan = side_path(part.with_name("part-20200101T000000000000-1-deadbeef.parquet"))
    shutil.copy(side_path(part), orphan)  # a writer killed after its side file, before its part
    store.append(varied_rows(100))
    assert not orphan.exists()
    assert sorted(p.name for p in (part.parent / ".side").iterdir()) == sorted(
        side_path(p).name for p in store.parts())


def test_message_text_gets_a_dictionary_page_sized_for_it(tmp_path):
    store = Store.create(tmp_path / "s")
    rows = [make_trajectory(i).to_row() for i in range(200)]
    for row in rows:  # one long text shared by every trajectory: stored once
        row["messages"][0]["content"] = "shared tool output " * 5000
    store.append(rows)
    meta = pq.read_metadata(store.parts()[0])
    paths = [meta.row_group(0).column(j).path_in_schema for j in range(meta.num_columns)]
    content = meta.row_group(0).column(paths.index("messages.list.element.content"))
    assert "RLE_DICTIONARY" in str(content.encodings)
    assert content.total_compressed_size < 20_000  # 200 copies of 95 KB, stored once
    assert DICTIONARY_PAGE_BYTES >= 64 * 1024 * 1024


# ---------------------------------------------------------------- automatic compaction


def test_small_appends_are_compacted_once_enough_accumulate(tmp_path):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=4, small_part_bytes=10_000_000))
    for batch in range(3):
        store.append([make_trajectory(batch * 10 + i).to_row() for i in range(10)])
    assert len(store.parts()) == 3
    store.append([make_trajectory(30 + i).to_row() for i in range(10)])
    assert len(store.parts()) == 1 and store.count() == 40
    (part,) = store.parts()
    assert store.side_files() == ([side_path(part)], [])
    assert store.check() == []
    seen = observe_trajectories(store.path, final=True)
    assert seen.partial is None and sorted(seen.keys) == sorted(f"traj-{i}" for i in range(40))


def test_large_parts_are_left_alone_and_zero_turns_it_off(tmp_path):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=2, small_part_bytes=1))  # no part is that small
    for batch in range(3):
        store.append([make_trajectory(batch * 10 + i).to_row() for i in range(10)])
    assert len(store.parts()) == 3
    store.set_compact_policy(OFF)
    store.append([make_trajectory(99).to_row()])
    assert len(store.parts()) == 4
    assert Store(store.path).compact_policy == OFF  # kept in the manifest for every process


def test_bad_auto_compact_settings_refuse_the_append_before_writing(tmp_path):
    store = Store.create(tmp_path / "s")
    store.update_manifest(auto_compact={"small_parts": 1})
    with pytest.raises(StoreError, match="at least 2"):
        store.append([make_trajectory(0).to_row()])
    store.update_manifest(auto_compact={"parts": 3})
    with pytest.raises(StoreError, match="unknown auto_compact"):
        store.append([make_trajectory(0).to_row()])
    assert store.parts() == []


def test_a_failed_automatic_compaction_keeps_the_append(tmp_path, monkeypatch):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=2))
    store.append([make_trajectory(0).to_row()])

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Store, "compact", broken)
    with pytest.warns(AutoCompactWarning, match="disk full"):
        appended = store.append([make_trajectory(1).to_row()])
    assert appended.written == 1 and store.count() == 2


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from conftest import make_trajectory
    import omrl.store.commit as store_module
    from omrl.store import Store

    moment = sys.argv[2]
    if moment == "writing":  # while the merged part is being written
        real = store_module.write_parquet
        def write(data, sink, rows=None):
            if data.num_rows > 50:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(data, sink, rows)
        store_module.write_parquet = write
    else:  # after the merged part is renamed in and the card rewritten, before the old parts are removed
        def remove(self, part):
            os.kill(os.getpid(), signal.SIGKILL)
        Store._remove_part = remove
    Store(sys.argv[1]).append([make_trajectory(1000 + i).to_row() for i in range(10)])
""")


@pytest.mark.parametrize("moment", ["writing", "removing"])
def test_a_sigkill_during_automatic_compaction_loses_and_doubles_nothing(tmp_path, moment):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(OFF)
    for batch in range(7):
        store.append([make_trajectory(batch * 10 + i).to_row() for i in range(10)])
    store.set_compact_policy(CompactPolicy(small_parts=8))
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT.format(tests=str(Path(__file__).parent)))
    done = subprocess.run([sys.executable, str(script), str(store.path), moment], capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr.decode()[-2000:]  # killed inside the compaction
    expected = sorted([f"traj-{i}" for i in range(70)] + [f"traj-{1000 + i}" for i in range(10)])
    seen = observe_trajectories(store.path)  # right after the kill: every row once, the card no wider
    assert seen.partial is None and sorted(seen.keys) == expected
    after = Store(store.path)
    assert sorted(after.sql("SELECT trajectory_id FROM tool_calls WHERE name = 'answer'").column(0).to_pylist()) == expected
    # the next writer finishes (cleanup, or the compaction again) and nothing is lost or doubled
    after.append([make_trajectory(2000).to_row()])
    final = observe_trajectories(store.path, final=True)
    assert final.partial is None and sorted(final.keys) == sorted(expected + ["traj-2000"])
    assert Counter(final.keys).most_common(1)[0][1] == 1
    assert after.check() == []
    assert sorted(p.name for p in (store.path / "data" / "trajectories" / ".side").iterdir()) == sorted(
        side_path(p).name for p in after.parts())


# ---------------------------------------------------------------- search hooks


def test_appends_leave_indexing_to_compaction_and_search_equals_the_scan(tmp_path):
    from omrl.store.search import index_path, missing_indexes, search

    store = Store.create(tmp_path / "s")
    store.set_compact_policy(OFF)
    store.append(varied_rows(0))
    store.append(varied_rows(100))
    old = store.parts()
    assert missing_indexes(store) == old  # appends build no index: searches scan these parts
    assert search(store, "hello").equals(search(store, "hello", use_index=False))
    merged = store.compact()
    assert index_path(merged).is_dir() and not any(index_path(p).exists() for p in old)
    assert missing_indexes(store) == []
    for query in ("calculator", "compute", "hello", "nothing-like-this", '"let me compute"'):
        assert search(store, query).equals(search(store, query, use_index=False)), query
    assert search(store, "hello").num_rows == 2


def test_compacting_a_single_part_builds_its_missing_index(tmp_path):
    from omrl.store.search import index_path, missing_indexes

    store = Store.create(tmp_path / "s")
    (part,) = [store.append(varied_rows(0)).part]
    assert missing_indexes(store) == [part]
    assert store.compact() is None  # nothing to merge
    assert store.parts() == [part] and index_path(part).is_dir() and missing_indexes(store) == []


def test_automatic_compaction_indexes_the_merged_part(tmp_path):
    from omrl.store.search import index_path, missing_indexes

    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=2))
    store.append(varied_rows(0))
    assert len(missing_indexes(store)) == 1
    store.append(varied_rows(100))
    (merged,) = store.parts()
    assert index_path(merged).is_dir() and missing_indexes(store) == []


def test_a_failed_index_build_keeps_the_compaction_and_search_scans(tmp_path, monkeypatch):
    import omrl.store.search

    def broken(part, table=None):
        raise RuntimeError("tantivy exploded")

    monkeypatch.setattr(omrl.store.search, "build_index", broken)
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(OFF)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an append never touches the index
        assert store.append(varied_rows(0)).written == 8
    store.append(varied_rows(100))
    with pytest.warns(SearchIndexWarning, match="tantivy exploded"):
        merged = store.compact()
    assert store.parts() == [merged] and store.count() == 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert omrl.store.search.search(store, "hello").column("trajectory_id").to_pylist() == ["chat-0", "chat-100"]
    assert json.loads((store.path / "omrl.json").read_text())["schema_version"] == 2
