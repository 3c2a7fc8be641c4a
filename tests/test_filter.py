"""Filters on a store with known contents: counts per reason, rejects, splits, rebuild from omrl.json."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.curate.filters import FilterOptions, filter_store, rebuild
from omrl.curate.minhash import NearDuplicateIndex, jaccard, shingles
from omrl.curate.splits import assign_split, parse_split
from omrl.schema import Message, ToolCall, Trajectory
from omrl.store import Store

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega"]


def traj(tid, task_id, sample, reward, text="look around", status="ok", success=None, turns=1, run="r") -> dict:
    msgs = [Message("user", f"task {task_id}")]
    for i in range(turns):
        msgs.append(Message("assistant", None, tool_calls=[ToolCall("look", json.dumps({"i": i}), f"c{i}")]))
        msgs.append(Message("tool", "nothing", tool_call_id=f"c{i}", name="look"))
    msgs.append(Message("assistant", text))
    return Trajectory(id=tid, task_id=task_id, run_id=run, sample=sample, messages=msgs, instruction=f"task {task_id}",
                      reward=reward, success=reward >= 1 if success is None and reward is not None else success,
                      status=status).to_row()


@pytest.fixture
def store(tmp_path):
    s = Store.create(tmp_path / "src")
    s.append([
        # group of task A: rewards 1, 0.5, 0 (distinct texts)
        traj("a0", "A", 0, 1.0, "the answer is 42"), traj("a1", "A", 1, 0.5, "maybe it is 41"),
        traj("a2", "A", 2, 0.0, "no idea at all"),
        # group of task B: flat (all 1.0), a1 and b1 are exact duplicates of each other's content except task
        traj("b0", "B", 0, 1.0, "done"), traj("b1", "B", 1, 1.0, "done"),
        # group C: a truncated and an errored episode, one long
        traj("c0", "C", 0, 0.2, "partial", status="truncated"), traj("c1", "C", 1, None, "crash", status="env_error"),
        traj("c2", "C", 2, 0.9, "long way", turns=6, success=True),
    ])
    s.append([{"trajectory_id": "a0", "annotator": "q", "score": 0.7},
              {"trajectory_id": "b0", "annotator": "q", "score": 0.1}], table="annotations")
    return s


def ids(path) -> set[str]:
    return Store(path).ids()


def test_row_filters_count_reasons_and_write_rejects(store, tmp_path):
    opts = FilterOptions(status="ok", success=True, max_turns=3)
    res = filter_store(store, tmp_path / "out", opts, rejects=tmp_path / "rej.parquet")
    assert ids(tmp_path / "out") == {"a0", "b0", "b1"}
    assert res.dropped == {"status": 2, "success": 2, "max_turns": 1}
    rej = pq.read_table(tmp_path / "rej.parquet").to_pylist()
    assert {(r["id"], r["reason"]) for r in rej} == {("c0", "status"), ("c1", "status"), ("a1", "success"),
                                                     ("a2", "success"), ("c2", "max_turns")}
    # Annotations of kept rows come along, others do not.
    ann = Store(tmp_path / "out").read("annotations").column("trajectory_id").to_pylist()
    assert sorted(ann) == ["a0", "b0"]


def test_where_min_reward_and_missing_reward(store, tmp_path):
    res = filter_store(store, tmp_path / "o1", FilterOptions(where="task_id <> 'A'", min_reward=0.5))
    assert ids(tmp_path / "o1") == {"b0", "b1", "c2"}
    assert res.dropped == {"where": 3, "min_reward": 1, "no_reward": 1}


def test_group_steps_flat_groups_and_best_of_n(store, tmp_path):
    res = filter_store(store, tmp_path / "o1", FilterOptions(drop_flat_groups=True))
    assert res.dropped == {"flat_group": 2} and "b0" not in ids(tmp_path / "o1")
    res = filter_store(store, tmp_path / "o2", FilterOptions(best_of_n=1))
    assert ids(tmp_path / "o2") == {"a0", "b0", "c2"}  # b0 beats b1 on the tie by id; c1 has no reward
    assert res.dropped == {"best_of_n": 4, "no_reward": 1}


def test_best_of_n_by_combined_reward(store, tmp_path):
    recipe = {"components": {"env_reward": 1.0, "q": 10.0}, "missing": "renormalize"}
    res = filter_store(store, tmp_path / "o", FilterOptions(best_of_n=1, reward_recipe=recipe, where="task_id='A'"))
    assert ids(tmp_path / "o") == {"a0"} and res.dropped["best_of_n"] == 2
    # The recipe is inlined in the lineage, so the rebuild needs no file.
    lineage = Store(tmp_path / "o").manifest["lineage"][0]
    assert lineage["options"]["reward_recipe"]["components"]["q"]["weight"] == 10.0


def test_exact_dedupe_keeps_best_copy(tmp_path):
    s = Store.create(tmp_path / "s")
    s.append([traj("x1", "T", 0, 0.2, "Same   Words here"), traj("x2", "T", 1, 0.9, "same words here", run="other"),
              traj("x3", "T", 2, 0.5, "different words")])
    res = filter_store(s, tmp_path / "o", FilterOptions(dedupe="exact"))
    assert ids(tmp_path / "o") == {"x2", "x3"} and res.dropped == {"duplicate": 1}


def _text(rng_words, n):
    return " ".join(rng_words[i % len(rng_words)] + str(i // len(rng_words)) for i in range(n))


def test_near_dedupe_threshold(tmp_path):
    base = _text(WORDS, 100).split()
    near = base.copy()
    near[50] = "CHANGED"  # one word changed in 100: 3 of 98 shingles differ -> Jaccard 95/101 = 0.94
    far = base.copy()
    for i in range(0, 100, 8):
        far[i] = f"other{i}"  # 13 edits: Jaccard well under 0.8
    a, b, c = " ".join(base), " ".join(near), " ".join(far)
    assert jaccard(shingles(a), shingles(b)) > 0.9 and jaccard(shingles(a), shingles(c)) < 0.7
    s = Store.create(tmp_path / "s")
    s.append([traj("n1", "T", 0, 1.0, a), traj("n2", "U", 0, 0.5, b), traj("n3", "V", 0, 0.5, c)])
    res = filter_store(s, tmp_path / "o", FilterOptions(dedupe="near", near_threshold=0.8))
    assert ids(tmp_path / "o") == {"n1", "n3"} and res.dropped == {"near_duplicate": 1}
    # At a threshold above their similarity, the pair is kept.
    res = filter_store(s, tmp_path / "o2", FilterOptions(dedupe="near", near_threshold=0.99))
    assert res.dropped == {}
    index = NearDuplicateIndex(0.8)
    assert index.check_and_add("1", a) is None
    other, sim = index.check_and_add("2", b)
    assert other == "1" and sim == pytest.approx(jaccard(shingles(a), shingles(b)))


def test_split_by_task_and_rebuild(store, tmp_path):
    for i in range(40):
        store.append([traj(f"s{i}-{k}", f"task{i}", k, 1.0, f"text {i} {k}") for k in range(2)])
    res = filter_store(store, tmp_path / "d", FilterOptions(split="val=0.25", seed=3))
    train, val = Store(tmp_path / "d"), Store(tmp_path / "d-val")
    t_tasks = set(train.read().column("task_id").to_pylist())
    v_tasks = set(val.read().column("task_id").to_pylist())
    assert t_tasks and v_tasks and not (t_tasks & v_tasks)  # no task in two splits
    assert res.kept["train"] + res.kept["val"] == 88
    assert all(assign_split(t, {"val": 0.25}, 3) == "val" for t in v_tasks)
    assert 4 <= len(v_tasks) <= 20  # about a quarter of 43 tasks
    manifest = train.manifest["lineage"][0]
    assert manifest["source"] == str(store.path.resolve()) and manifest["options"]["split"] == "val=0.25"
    again = rebuild(tmp_path / "d", tmp_path / "again")
    assert again.ids == res.ids
    assert again.ids["train"] == sorted(Store(tmp_path / "again").ids())
    with pytest.raises(ValueError, match="leave nothing"):
        parse_split("val=0.5,test=0.5")
    with pytest.raises(ValueError, match="not empty"):
        filter_store(store, tmp_path / "d", FilterOptions())


def test_filter_cli(store, tmp_path):
    rej = tmp_path / "rej.parquet"
    result = CliRunner().invoke(cli, ["filter", str(store.path), "--out", str(tmp_path / "o"), "--status", "ok",
                                      "--drop-flat-groups", "--rejects", str(rej)])
    assert result.exit_code == 0, result.output
    assert "dropped: flat_group" in result.output and "dropped: status" in result.output
    assert ids(tmp_path / "o") == {"a0", "a1", "a2"}  # C is left with c2 alone: flat
    result = CliRunner().invoke(cli, ["filter", str(tmp_path / "o"), "--out", str(tmp_path / "r"), "--rebuild"])
    assert result.exit_code == 0, result.output
    assert ids(tmp_path / "r") == ids(tmp_path / "o")
    bad = CliRunner().invoke(cli, ["filter", str(store.path), "--out", str(tmp_path / "x"), "--split", "val=2"])
    assert bad.exit_code != 0 and "bad split" in bad.output


def test_row_filters_run_in_duckdb_and_read_only_kept_rows(store, tmp_path, monkeypatch):
    # The row filters never read the whole trajectories table into Python.
    real_read = Store.read

    def read(self, table="trajectories", columns=None):
        assert table != "trajectories", "filter_store read every trajectory into Python"
        return real_read(self, table, columns)

    monkeypatch.setattr(Store, "read", read)
    rej = tmp_path / "rej.parquet"
    # An OR in the --where cannot reach past its own condition: the status filter still applies.
    res = filter_store(store, tmp_path / "o", FilterOptions(where="task_id = 'C' OR true", status="ok",
                                                            max_turns=3, best_of_n=1), rejects=rej)
    assert ids(tmp_path / "o") == {"a0", "b0"}
    assert res.source_rows == 8
    assert res.dropped == {"status": 2, "max_turns": 1, "best_of_n": 3}
    res = filter_store(store, tmp_path / "o2", FilterOptions(where="reward >= 0.5 AND task_id <> 'B'", success=True),
                       rejects=rej)
    assert ids(tmp_path / "o2") == {"a0", "c2"} and res.dropped == {"where": 5, "success": 1}
    rejected = pq.read_table(rej)
    assert rejected.schema.field("reason").type == "string" and rejected.num_rows == 6
    assert {(r["id"], r["reason"]) for r in rejected.select(["id", "reason"]).to_pylist()} == {
        ("a2", "where"), ("b0", "where"), ("b1", "where"), ("c0", "where"), ("c1", "where"), ("a1", "success")}
    # Full rows in the rejects file: messages survive the trip through DuckDB.
    assert all(r["messages"] for r in rejected.to_pylist())


@pytest.mark.parametrize("where", ["   ", "true; SELECT 1", "true) OR (true", "id IN (SELECT * FROM read_text('/etc/passwd'))",
                                   "true -- comment"])
def test_where_still_goes_through_the_checker(store, tmp_path, where):
    from omrl.store.query import QueryError

    with pytest.raises(QueryError):
        filter_store(store, tmp_path / "o", FilterOptions(where=where))
    assert not (tmp_path / "o").exists()


def test_row_filter_values_are_typed(store, tmp_path):
    with pytest.raises(ValueError, match="max_turns"):
        FilterOptions(max_turns="3 OR true")
    with pytest.raises(ValueError, match="status"):
        FilterOptions(status=1)
    # A quote in a status is a value, not SQL.
    res = filter_store(store, tmp_path / "o", FilterOptions(status="ok' OR 'x' = 'x"))
    assert res.kept["train"] == 0 and res.dropped == {"status": 8}
