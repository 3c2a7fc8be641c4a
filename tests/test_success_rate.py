"""One success rate: solved / episodes with a known outcome, failed and unknown success counted beside it.

stats, report's round stats, the `groups` view, eval_metrics and the bridge all follow omrl.schema.
"""

from __future__ import annotations

import pytest
from conftest import make_trajectory

from omrl.report import round_stats
from omrl.report.stats import store_stats
from omrl.rollout import eval_metrics
from omrl.schema import FAILED_STATUSES, STATUSES, SuccessCounts, is_failed, success_counts
from omrl.store import Store
from omrl.train.data.bridge import load_rows

# (status, success): 3 solved, 3 unsolved (one truncated), 3 failed (one of them an import's success=False,
# still not a failure), 2 finished with unknown success.
OUTCOMES = [("ok", True), ("ok", True), ("ok", True), ("ok", False), ("ok", False), ("truncated", False),
            ("policy_error", None), ("timeout", None), ("env_error", False), ("ok", None), ("ok", None)]
EXPECTED = {"success_rate": 0.5, "failed": 3, "unknown_success": 2}


def _rows(outcomes, group: str = "g"):
    rows = []
    for i, (status, success) in enumerate(outcomes):
        t = make_trajectory(i, task_id="t", sample=i, status=status, success=success,
                            reward=None if success is None else float(bool(success)))
        t.group_id = group
        rows.append(t.to_row())
    return rows


@pytest.fixture
def store(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append(_rows(OUTCOMES))
    return store


def _pick(row):
    return {k: row[k] for k in EXPECTED}


def test_definition():
    assert set(FAILED_STATUSES) == {"env_error", "policy_error", "timeout"} <= set(STATUSES)
    assert is_failed("timeout") and not is_failed("truncated") and not is_failed(None)
    counts = success_counts({"status": s, "success": ok} for s, ok in OUTCOMES)
    assert counts == SuccessCounts(episodes=11, solved=3, known=6, failed=3, unknown_success=2)
    assert counts.as_dict() == EXPECTED
    assert success_counts([{"status": "timeout", "success": None}]).rate is None  # nothing known: no rate, not 0


def test_stats_report_groups_and_eval_agree(store):
    tables = store_stats(store)
    assert _pick(tables["overview"].to_pylist()[0]) == EXPECTED
    assert _pick(tables["by env"].to_pylist()[0]) == EXPECTED
    by_status = {r["status"]: r for r in tables["by status"].to_pylist()}
    assert by_status["timeout"]["success_rate"] is None and by_status["timeout"]["failed"] == 1
    assert by_status["truncated"]["success_rate"] == 0.0

    (rnd,) = round_stats(store)
    assert _pick(rnd) == EXPECTED and rnd["trajectories"] == 11

    (group,) = store.sql("SELECT * FROM groups").to_pylist()
    assert _pick(group) == EXPECTED and group["n"] == 11

    metrics = eval_metrics(store.read().to_pylist(), ks=(1,))["math"]
    assert _pick(metrics) == EXPECTED and metrics["episodes"] == 11 and metrics["errors"] == 3
    assert metrics["pass@1"] == pytest.approx(0.5)  # over known outcomes only


def test_issue_store_four_solved_four_policy_errors(tmp_path):
    """The issue's store: stats said 1.0 and report 0.5; every reader now says 1.0 with 4 failed beside it."""
    store = Store.create(tmp_path / "s")
    store.append(_rows([("ok", True)] * 4 + [("policy_error", None)] * 4))
    expected = {"success_rate": 1.0, "failed": 4, "unknown_success": 0}
    assert _pick(store_stats(store)["overview"].to_pylist()[0]) == expected
    assert _pick(round_stats(store)[0]) == expected
    assert _pick(store.sql("SELECT * FROM groups").to_pylist()[0]) == expected
    assert _pick(eval_metrics(store.read().to_pylist())["math"]) == expected


def test_sft_rows_exclude_every_failed_status(store):
    kept = load_rows(store)
    assert len(kept) == 8 and not any(is_failed(r["status"]) for r in kept)
    assert {r["status"] for r in kept} == {"ok", "truncated"}


def test_rl_progress_and_iterate_interval_use_the_one_definition(tmp_path):
    from types import SimpleNamespace

    from omrl.progress import LineReporter
    from omrl.train.config.grpo import GRPORecipe
    from omrl.train.data.rollout_step import RolloutStep
    from omrl.train.iterate.evaluation import success_ci95

    shown = LineReporter(every_s=3600)
    rollouts = RolloutStep(GRPORecipe(model="m", tasks="t.jsonl", output_dir="o"), "grpo", reporter=shown)
    rollouts._count([SimpleNamespace(row=row) for row in _rows(OUTCOMES)])
    # The failed env_error row with success=False is not an unsolved episode: 3 solved of 6 known.
    assert shown.fields["success"] == EXPECTED["success_rate"]
    two_tasks = Store.create(tmp_path / "two")
    two_tasks.append(_rows([("ok", True), ("env_error", False)], group="g1")
                     + [dict(r, id=r["id"] + "-b", task_id="u") for r in _rows([("ok", False), ("ok", True)])])
    # task t: 1.0 (the env_error row left out), task u: 0.5 -> mean 0.75, sample std 0.354, n 2
    assert success_ci95(two_tasks, "run-a", 0) == round(1.96 * (0.125 ** 0.5) / 2 ** 0.5, 4)
