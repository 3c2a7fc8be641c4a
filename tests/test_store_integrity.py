"""Store integrity: ids unique under concurrent writers, whole commits, derived stores staged, cleanup finished.

Each test reproduces a finding of the trust probe (issue 8) that the code before this change failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import make_trajectory

from omrl.cli.main import cli
from omrl.formats.importer import import_files
from omrl.store import Store, StoreError
from tests.cases.chaos import observe_trajectories

ROOT = Path(__file__).resolve().parents[1]
GRID_TASKS = ROOT / "datasets" / "tasks" / "grid_train.jsonl"


def rows(n: int, start: int = 0) -> list[dict]:
    return [make_trajectory(i).to_row() for i in range(start, start + n)]


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# ---------------------------------------------------------------- unique ids (findings 5 and 6)


def test_two_identical_collects_at_once_store_every_episode_once(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(GRID_TASKS.read_text().splitlines()[:150]) + "\n")
    argv = [sys.executable, "-m", "omrl", "collect", "--env", "grid", "--tasks", str(tasks), "--policy", "scripted",
            "--store", str(tmp_path / "s"), "-n", "4", "--batch-size", "8", "--run", "twice", "--concurrency", "4"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    store = Store(tmp_path / "s")
    ids = store.read(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 600
    groups = store.sql("SELECT max(n) AS largest FROM groups").to_pylist()
    assert groups == [{"largest": 4}]  # GRPO groups keep their size
    assert store.check() == []


def test_collect_counts_what_it_wrote_and_what_a_racing_run_stored_first(tmp_path, monkeypatch):
    from omrl.envs.grid import GridEnv
    from omrl.policies.scripted import ScriptedPolicy
    from omrl.rollout import collect
    from omrl.tasks import load_tasks

    tasks = load_tasks(GRID_TASKS)[:10]
    store = Store.create(tmp_path / "s")
    first = asyncio.run(collect(GridEnv, tasks, ScriptedPolicy(), store, samples=2, run_id="r"))
    assert first.written == 20 and store.count() == 20
    # Another run of the same command stored half of these episodes after this run read the store's ids.
    other = Store.create(tmp_path / "t")
    other.append(store.read().slice(0, 10))
    monkeypatch.setattr(Store, "ids", lambda self, table="trajectories": set())
    raced = asyncio.run(collect(GridEnv, tasks, ScriptedPolicy(), other, samples=2, run_id="r"))
    assert raced.played == 20 and raced.written == 10 and raced.already_stored == 10
    monkeypatch.undo()
    assert other.count() == 20 and len(other.ids()) == 20


def test_appending_ids_the_store_holds_is_refused_whole(store):
    before = store.parts()
    with pytest.raises(StoreError, match="1 of 2 trajectories rows have ids the store already holds"):
        store.append([make_trajectory(0).to_row(), make_trajectory(50).to_row()])
    assert store.parts() == before
    appended = store.append([make_trajectory(0).to_row(), make_trajectory(50).to_row()], skip_existing=True)
    assert (appended.written, appended.skipped) == (1, 1)
    assert store.count() == 7 and len(store.ids()) == 7


def test_rows_sharing_an_id_in_one_append_are_refused(tmp_path):
    store = Store.create(tmp_path / "s")
    same = [dict(make_trajectory(i).to_row(), id="dup") for i in range(3)]
    with pytest.raises(StoreError, match="ids occur more than once.*dup"):
        store.append(same)
    with pytest.raises(StoreError, match="more than once"):
        store.append(same, skip_existing=True)
    assert store.count() == 0


def test_store_append_cli_of_the_same_file_twice_keeps_one_copy(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows(5000)))
    target = str(tmp_path / "s")
    assert CliRunner().invoke(cli, ["store", "append", target, str(source)]).exit_code == 0
    again = CliRunner().invoke(cli, ["store", "append", target, str(source)])
    assert again.exit_code == 1 and "already holds" in again.output
    store = Store(target)
    assert store.count() == 5000 and len(store.parts()) == 1  # 5,000 rows: one part, one commit


APPENDER = textwrap.dedent(
    """
    import sys
    from omrl.store import Store
    store = Store(sys.argv[1])
    for batch in range(30):  # both processes append the same ids: only one copy of each may land
        store.append([{"id": f"row-{batch}-{i}", "task_id": f"t{i}"} for i in range(20)], skip_existing=True)
    """
)


def test_concurrent_appends_of_the_same_ids_keep_one_copy(tmp_path):
    store = Store.create(tmp_path / "s")
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(store.path)]) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert store.count() == 600 and len(store.ids()) == 600


# ---------------------------------------------------------------- whole commits of derived stores (finding 7)


def test_a_failed_derived_store_leaves_nothing_at_its_path(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), Store.staged(tmp_path / "out") as staged:
        staged.append(rows(3))
        raise RuntimeError("boom")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging folder left either


def test_a_killed_derived_store_is_cleaned_up_by_the_next_one(tmp_path):
    stale = tmp_path / f".out.staging-{dead_pid()}-0123abcd"
    (stale / "data").mkdir(parents=True)
    with Store.staged(tmp_path / "out") as staged:
        staged.append(rows(2))
    assert not stale.exists()
    assert Store(tmp_path / "out").count() == 2


def test_a_staged_store_is_invisible_until_complete(tmp_path):
    with Store.staged(tmp_path / "out", lineage={"command": "test"}) as staged:
        staged.append(rows(2))
        assert not (tmp_path / "out").exists()
    final = Store(tmp_path / "out")
    assert final.count() == 2 and final.manifest["lineage"] == [{"command": "test"}]
    assert staged.path == tmp_path / "out"


def test_filter_output_is_whole_after_the_command_and_refused_only_if_complete(store, tmp_path):
    from omrl.curate.filters import FilterOptions, filter_store

    store.append([{"trajectory_id": "traj-1", "annotator": "len", "score": 1.0}], table="annotations")
    result = filter_store(store, tmp_path / "out", FilterOptions(split="val=0.5"))
    for path in result.stores.values():
        assert (path / "omrl.json").is_file()
    assert not list(tmp_path.glob(".out*"))  # staging folders renamed away
    with pytest.raises((StoreError, ValueError), match="exists and is not empty|already holds"):
        filter_store(store, tmp_path / "out", FilterOptions(split="val=0.5"))


def test_export_overwrite_swaps_the_old_export_only_when_the_new_one_is_complete(store, tmp_path, monkeypatch):
    from omrl.formats.exporters import export_store

    export_store(store, tmp_path / "out", fmt="parquet")
    assert Store(tmp_path / "out").count() == 6

    def broken_append(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Store, "append", broken_append)
    with pytest.raises(OSError, match="disk full"):
        export_store(store, tmp_path / "out", fmt="parquet", overwrite=True)
    monkeypatch.undo()
    assert Store(tmp_path / "out").count() == 6  # the earlier export is still there, whole


# ---------------------------------------------------------------- compaction cleanup and the card (finding 8)


def crash_after_compaction(store: Store) -> list[Path]:
    """A compaction killed after renaming its part in and rewriting the card, before removing the old parts."""
    saved = {p: p.read_bytes() for p in store.parts()}
    store.compact()
    for path, data in saved.items():
        path.write_bytes(data)
    return list(saved)


def test_load_dataset_never_counts_a_crashed_compactions_leftovers(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    store = Store.create(tmp_path / "s")
    for i in range(4):
        store.append(rows(5, start=5 * i))
    crash_after_compaction(store)
    assert len(list((store.path / "data" / "trajectories").glob("part-*.parquet"))) == 5
    ds = datasets.load_dataset(str(store.path), "trajectories", split="train")
    assert len(ds) == 20 and len(set(ds["id"])) == 20


def test_the_next_writer_finishes_a_crashed_compactions_cleanup(tmp_path):
    store = Store.create(tmp_path / "s")
    for i in range(3):
        store.append(rows(2, start=2 * i))
    leftovers = crash_after_compaction(store)
    Store(store.path).append(rows(1, start=100))
    assert not any(p.exists() for p in leftovers)
    assert store.count() == 7


def test_a_compaction_rerun_and_repair_remove_leftovers_and_stale_temporary_files(tmp_path):
    store = Store.create(tmp_path / "s")
    for i in range(3):
        store.append(rows(2, start=2 * i))
    leftovers = crash_after_compaction(store)
    folder = store.path / "data" / "trajectories"
    stale = folder / f".part-20260101T000000000000-{dead_pid()}-deadbeef.parquet.tmp"
    live = folder / f".part-20260101T000000000000-{os.getpid()}-cafef00d.parquet.tmp"
    stale.write_bytes(b"half a part")
    live.write_bytes(b"being written")
    result = CliRunner().invoke(cli, ["store", "check", str(store.path), "--repair"])
    assert result.exit_code == 0, result.output
    assert "4 leftover file(s) removed" in result.output
    assert not stale.exists() and live.exists() and not any(p.exists() for p in leftovers)
    assert store.count() == 6


def test_a_compaction_killed_before_its_card_rewrite_is_finished_with_a_valid_card(tmp_path):
    store = Store.create(tmp_path / "s")
    for i in range(3):
        store.append(rows(2, start=2 * i))
    card = (store.path / "README.md").read_text()
    leftovers = crash_after_compaction(store)
    (store.path / "README.md").write_text(card)  # killed after the rename, before the card was rewritten
    assert Store(store.path).compact() is None  # one live part: nothing to merge, but the cleanup is finished
    assert not any(p.exists() for p in leftovers)
    seen = observe_trajectories(store.path, final=True)
    assert seen.partial is None and len(seen.keys) == 6


def _store_with_stale_card(tmp_path: Path) -> Store:
    """Two appends of 2 rows, the second killed after its rename, before the card was rewritten."""
    store = Store.create(tmp_path / "s")
    store.append(rows(2))
    card = (store.path / "README.md").read_text()
    store.append(rows(2, start=2))
    (store.path / "README.md").write_text(card)
    assert observe_trajectories(store.path, final=True).partial
    return store


def test_a_writer_heals_a_card_left_stale_by_a_kill(tmp_path):
    store = _store_with_stale_card(tmp_path)
    Store.create(store.path)  # the next writer opening the store
    assert observe_trajectories(store.path, final=True).partial is None


def test_an_append_with_every_row_present_heals_a_card_left_stale_by_a_kill(tmp_path):
    store = _store_with_stale_card(tmp_path)
    assert store.append(rows(2, start=2), skip_existing=True).skipped == 2  # the rerun: nothing new
    seen = observe_trajectories(store.path, final=True)
    assert seen.partial is None and len(seen.keys) == 4


def test_an_import_with_nothing_new_heals_a_card_left_stale_by_a_killed_import(tmp_path):
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                                                        {"role": "assistant", "content": "a"}]}) + "\n"
                              for i in range(3)))
    store = Store.create(tmp_path / "s")
    store.append(rows(2))  # a card listing parts by name (an empty store's lists a glob)
    card = (store.path / "README.md").read_text()
    import_files([source], store.path)
    (store.path / "README.md").write_text(card)  # killed after its commit, before the card was rewritten
    assert observe_trajectories(store.path, final=True).partial
    (report,) = import_files([source], store.path)  # run again: every record is already there
    assert report.status == "nothing new" and report.already_present == 3
    seen = observe_trajectories(store.path, final=True)
    assert seen.partial is None and len(seen.keys) == 5


def test_check_reports_ids_stored_twice_and_compact_keeps_one_copy(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append(rows(3))
    old_writer_part = store.path / "data" / "trajectories" / "part-20990101T000000000000-1-0ld00000.parquet"
    pq.write_table(store.read().slice(0, 2), old_writer_part)  # written by a version without the id check
    assert "not listed" in store.check()[0].error  # its rows are invisible until a repair adds the part
    assert store.repair().adopted == [str(old_writer_part)]
    problems = store.check()
    assert len(problems) == 1 and "2 trajectories ids appear more than once" in problems[0].error
    result = CliRunner().invoke(cli, ["store", "check", str(store.path)])
    assert result.exit_code == 1 and "appear more than once" in result.output
    store.compact()
    assert store.count() == 3 and store.check() == []


def test_the_card_lists_exactly_the_live_parts(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append(rows(2))
    store.append(rows(2, start=2))
    card = (store.path / "README.md").read_text()
    for part in store.parts():
        assert f"data/trajectories/{part.name}" in card
    assert "data/annotations/part-*.parquet" in card  # a table without parts keeps the glob
    assert card.count("# s") == 1  # the text below the front matter is kept
    new = store.compact()
    card = (store.path / "README.md").read_text()
    assert f"data/trajectories/{new.name}" in card and card.count("data/trajectories/part-") == 1


# ---------------------------------------------------------------- creation races (finding 8)


CREATOR = textwrap.dedent(
    """
    import sys
    from omrl.store import Store
    store = Store.create(sys.argv[1])
    store.append([{"id": f"{sys.argv[2]}-{i}", "task_id": "t"} for i in range(5)])
    """
)


def test_a_store_created_between_the_checks_of_create_is_opened(tmp_path, monkeypatch):
    """The window the process race hits: another process renames its new store in after create found no
    manifest and before it checked the folder for foreign files. create opens that store."""
    import omrl.store.store as store_module

    target = tmp_path / "s"
    real = store_module._refuse_foreign

    def racing(root):
        monkeypatch.setattr(store_module, "_refuse_foreign", real)
        Store.create(root).append([{"id": "theirs", "task_id": "t"}])  # the other process, finished meanwhile
        real(root)

    monkeypatch.setattr(store_module, "_refuse_foreign", racing)
    assert Store.create(target).count() == 1
    monkeypatch.setattr(store_module, "_refuse_foreign", racing)
    with pytest.raises(StoreError, match="already holds a store"):
        Store.create(tmp_path / "t", exist_ok=False)


def test_processes_racing_to_create_one_store_all_succeed(tmp_path):
    target = tmp_path / "parent" / "s"
    procs = [subprocess.Popen([sys.executable, "-c", CREATOR, str(target), f"p{i}"], stderr=subprocess.PIPE)
             for i in range(8)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, errors
    assert Store(target).count() == 40
    assert [p.name for p in target.parent.iterdir()] == ["s"]  # no staging folder left behind


def test_create_still_refuses_a_foreign_folder_and_a_file(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "mine.txt").write_text("x")
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "f", tmp_path / "file"):
        with pytest.raises(StoreError, match="not empty and is not an omrl store"):
            Store.create(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert Store.create(empty).count() == 0


def test_annotate_resumes_instead_of_doubling(store):
    from omrl.annotate.runner import annotate

    first = annotate(store, metrics=["num_turns", "exact_match"])
    assert sum(first.written.values()) == 12
    second = annotate(store, metrics=["num_turns", "exact_match"])
    assert sum(second.written.values()) == 0 and second.already_done == {"num_turns": 6, "exact_match": 6}
    assert store.count("annotations") == 12
    again = annotate(store, metrics=["num_turns"], redo=True)
    assert again.written["num_turns"] == 6 and store.count("annotations") == 18


def test_an_annotate_with_nothing_left_heals_a_card_left_stale_by_a_killed_annotate(store):
    from omrl.annotate.runner import annotate
    from omrl.store.card import card_parts

    annotate(store, metrics=["num_turns"])
    card = (store.path / "README.md").read_text()
    annotate(store, metrics=["exact_match"])
    live = sorted(p.name for p in (store.path / "data" / "annotations").glob("part-*.parquet"))
    assert len(live) == 2 and card_parts((store.path / "README.md").read_text())["annotations"] == live
    (store.path / "README.md").write_text(card)  # killed after its commit, before the card was rewritten
    assert annotate(store, metrics=["exact_match"]).already_done == {"exact_match": 6}  # nothing left to write
    assert card_parts((store.path / "README.md").read_text())["annotations"] == live


def test_an_appended_arrow_table_is_checked_like_rows(store):
    table = pa.Table.from_pylist([make_trajectory(1).to_row()])
    with pytest.raises(StoreError, match="already holds"):
        store.append(table)
