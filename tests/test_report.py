"""`omrl report` writes real plots and a summary listing every round."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("matplotlib")

from click.testing import CliRunner  # noqa: E402

from omrl.schema import Message, Trajectory  # noqa: E402
from omrl.store import Store  # noqa: E402


def test_report_files_have_content(tmp_path):
    store = Store.create(tmp_path / "s")
    rows = []
    for r in range(3):
        for i in range(6):
            ok = i < 2 + r
            rows.append(Trajectory(id=f"r{r}-{i}", task_id=f"t{i}", round=r, group_id=f"g{r}-{i // 3}",
                                   messages=[Message("user", "go"), Message("assistant", "up")],
                                   reward=1.0 if ok else 0.0, success=ok, num_turns=1 + i % 3,
                                   prompt_tokens=10 * i, completion_tokens=5).to_row())
    rows.append(Trajectory(id="e", task_id="t0", source="eval", messages=[Message("user", "go")], reward=5.0,
                           success=True).to_row())
    store.append(rows)
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"stage": "base", "success": 0.0, "mean_reward": 0.0, "tasks": 6},
                                   {"stage": "sft", "success": 0.3, "mean_reward": 0.4, "tasks": 6},
                                   {"stage": "grpo-1", "success": 0.5, "mean_reward": 0.6, "tasks": 6}]))
    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "rep"),
                                      "--results", str(results)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "rep"
    for name in ("rounds.png", "distributions.png", "stages.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    md = (out / "report.md").read_text()
    # one row per collected round with its success rate (eval rows excluded), and every stage
    assert "| 0 | 6 | 0.333 |" in md and "| 1 | 6 | 0.500 |" in md and "| 2 | 6 | 0.667 |" in md
    assert "| grpo-1 | 0.500 |" in md
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<td>grpo-1</td>" in page


def test_report_on_empty_store_is_a_clean_error(tmp_path):
    from omrl.cli.main import cli

    Store.create(tmp_path / "s")
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "s"), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and "no trajectories" in result.output


def test_report_counts_failed_and_unknown_beside_the_rate(tmp_path):
    """Failed episodes and unknown success are shown beside the rate, never counted as failures."""
    from omrl.report import write_report

    store = Store.create(tmp_path / "s")
    outcomes = [("ok", True)] * 4 + [("policy_error", None)] * 3 + [("ok", None)]
    store.append([Trajectory(id=f"t{i}", task_id="t", messages=[Message("user", "go")], status=status,
                             success=success).to_row() for i, (status, success) in enumerate(outcomes)])
    md = write_report(store, tmp_path / "rep")["markdown"].read_text()
    assert "| round | trajectories | success_rate | failed | unknown_success |" in md
    assert "| 0 | 8 | 1.000 | 3 | 1 |" in md


# ------------------------------------------------------------------ per-step curves from real training runs

def _report(store, out, *args):
    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["report", str(store), "--out", str(out), *map(str, args)])
    assert result.exit_code == 0, result.output
    return (out / "report.md").read_text()


def _md_rows(md: str, header: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header line starts with `header`, as dicts of cell text."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


@pytest.mark.slow
def test_grpo_run_log_and_stored_rollouts_give_per_step_curves(tmp_path):
    """A real two-step GRPO run on the tiny model: the report reads its omrl_grpo.json under --runs (found
    recursively) and its stored rollouts per step, and both agree with what the run wrote."""
    pytest.importorskip("trl")
    from omrl.envs.base import Task
    from omrl.models.tiny import build_tiny_model
    from omrl.report import find_run_logs
    from omrl.rollout import RolloutSettings
    from omrl.tasks import write_tasks
    from omrl.train.algorithms.grpo import train_grpo
    from omrl.train.config.grpo import GRPORecipe

    model = build_tiny_model(tmp_path / "tiny", hidden=64, layers=2)
    tasks = write_tasks([Task(id=f"t{i}", instruction="say", env="letter") for i in range(4)],
                        tmp_path / "tasks.jsonl")
    run_dir = tmp_path / "run"
    train_grpo(GRPORecipe(model=str(model), tasks=str(tasks), output_dir=str(run_dir / "round-1" / "grpo"),
                          rollout=RolloutSettings(env="test_grpo:LetterEnv", max_turns=1, max_new_tokens=8),
                          store=str(tmp_path / "store"), run_name="g", round=1, max_steps=2, tasks_per_step=2,
                          samples_per_task=4, warmup_steps=0, learning_rate=1e-2, logging_steps=1, quiet=True))
    written = json.loads((run_dir / "round-1" / "grpo" / "omrl_grpo.json").read_text())["log"]
    logs = find_run_logs([run_dir])
    assert [(log.kind, log.label, log.round) for log in logs] == [("grpo", "round-1/grpo", 1)]
    steps = logs[0].steps
    assert [s["step"] for s in steps] == [e["step"] for e in written if "loss" in e] == [1, 2]
    for step, entry in zip(steps, [e for e in written if "loss" in e], strict=True):
        assert step["loss"] == entry["loss"] and step["reward"] == entry["reward"]
        assert step["entropy"] == entry["entropy"]

    # a judge's scores on those rollouts (as online judging stores them): its mean per step
    from omrl.report import stored_step_scores
    from omrl.schema import Annotation

    rows = Store(tmp_path / "store").read().to_pylist()
    notes = [Annotation(trajectory_id=r["id"], annotator="judge", score=(i % 5) / 4).to_row()
             for i, r in enumerate(rows)]
    Store(tmp_path / "store").append(notes, table="annotations")
    expected = {}
    for row, note in zip(rows, notes, strict=True):
        expected.setdefault(json.loads(row["metadata"])["grpo_step"] + 1, []).append(note["score"])
    got = stored_step_scores(Store(tmp_path / "store"))
    assert [(g["run"], g["annotator"], g["step"], g["n"]) for g in got] == [
        ("g/round-1", "judge", step, len(v)) for step, v in sorted(expected.items())]
    assert [g["mean_score"] for g in got] == pytest.approx([sum(v) / len(v) for _, v in sorted(expected.items())])

    md = _report(tmp_path / "store", tmp_path / "rep", "--runs", run_dir)
    data = (tmp_path / "rep" / "steps.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "![training curves per step](steps.png)" in md
    [logged] = _md_rows(md, "| run | kind | round | steps | last_step |")
    assert logged["run"] == "round-1/grpo" and logged["steps"] == "2" and logged["last_step"] == "2"
    assert logged["last_reward"] == f"{[e for e in written if 'loss' in e][-1]['reward']:.3f}"
    # per step from the store: rollouts of TRL step k (grpo_step k-1), computed here from the raw rows
    [stored] = _md_rows(md, "| run | round | kind | steps | episodes |")
    assert stored["run"] == "g/round-1" and stored["steps"] == "2" and stored["episodes"] == str(len(rows)) == "16"
    last = [r for r in rows if json.loads(r["metadata"])["grpo_step"] == 1]
    assert stored["last_success"] == f"{sum(bool(r['success']) for r in last) / len(last):.3f}"
    assert stored["last_reward"] == f"{sum(r['reward'] for r in last) / len(last):.3f}"
    page = (tmp_path / "rep" / "report.html").read_text()
    # the judge's annotations also give the agreement section: one round, all 16 rollouts
    assert page.count("data:image/png;base64,") == 4 and "<h2>Training steps</h2>" in page
    [agree] = _md_rows(md, "| annotator | round | n |")
    assert (agree["annotator"], agree["round"], agree["n"]) == ("judge", "1", "16")


@pytest.mark.slow
def test_ppo_run_log_gives_its_value_and_clip_curves(tmp_path):
    """A real two-step PPO run: value loss, explained variance, clip fraction and approx KL per step."""
    pytest.importorskip("transformers")
    from omrl.envs.base import Task
    from omrl.report import STEP_KEYS, find_run_logs
    from omrl.rollout import RolloutSettings
    from omrl.tasks import write_tasks
    from omrl.train.algorithms.ppo import train_ppo
    from omrl.train.config.ppo import PPORecipe
    from tests.train_helpers import random_mover_model

    model = random_mover_model(tmp_path / "mover")
    tasks = write_tasks([Task(id=f"g{x}", instruction="Reach the goal.", env="grid",
                              payload={"size": 7, "start": [x, 3], "goal": [x - 1, 3]}) for x in range(2, 6)],
                        tmp_path / "tasks.jsonl")
    result = train_ppo(PPORecipe(model=str(model), tasks=str(tasks), output_dir=str(tmp_path / "ppo"),
                                 store=str(tmp_path / "store"), rollout=RolloutSettings(env="grid", max_turns=1,
                                                                                      max_new_tokens=4),
                                 max_steps=2, tasks_per_step=2, samples_per_task=4, ppo_epochs=1, minibatches=1,
                                 quiet=True))
    [log] = find_run_logs([tmp_path / "ppo"])
    assert log.kind == "ppo" and [s["step"] for s in log.steps] == [0, 1]
    for step, entry in zip(log.steps, result.history, strict=True):
        assert step["loss"] == entry["policy_loss"] and step["success"] == entry["success"]
        for name in ("value_loss", "clip_fraction", "approx_kl", "entropy", "reward"):
            assert step[name] == entry[name], name
        assert "kl" not in step  # kl_ref is NaN without a reference model: no value, not 0
        assert math.isnan(entry["kl_ref"])
    assert {"reward", "success", "loss", "entropy", "value_loss", "clip_fraction", "approx_kl"} <= set(log.steps[-1])
    assert set(log.steps[-1]) - {"step"} <= set(STEP_KEYS)
    md = _report(tmp_path / "store", tmp_path / "rep", "--runs", tmp_path / "ppo")
    [logged] = _md_rows(md, "| run | kind | round | steps | last_step |")
    assert logged["kind"] == "ppo" and logged["steps"] == "2"
    assert logged["last_success"] == f"{result.history[-1]['success']:.3f}"


def test_runs_option_refuses_what_is_not_a_run_log(tmp_path):
    from omrl.cli.main import cli

    store = Store.create(tmp_path / "s")
    store.append([Trajectory(id="a", task_id="t", messages=[Message("user", "go")], reward=1.0).to_row()])
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "o"),
                                      "--runs", str(tmp_path / "empty")])
    assert result.exit_code != 0 and "no omrl_grpo.json or omrl_ppo.json under it" in result.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "omrl_grpo.json").write_text("[1, 2")
    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "o"),
                                      "--runs", str(tmp_path / "bad")])
    assert result.exit_code != 0 and "unreadable run log" in result.output and "Traceback" not in result.output
    (tmp_path / "bad" / "omrl_grpo.json").write_text('{"log": {"step": 1}}')
    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "o"),
                                      "--runs", str(tmp_path / "bad")])
    assert result.exit_code != 0 and "with a 'log' list" in result.output
    assert "--runs" in CliRunner().invoke(cli, ["report", "--help"]).output


# ------------------------------------------------------------------ judge vs environment agreement

def _agreement_store(tmp_path):
    """Three rounds of 12 trajectories; judge `j` follows the reward in rounds 0 and 1 and inverts it in
    round 2; `coarse` scores in three tied levels. Returns the store and the pairs each should be scored on."""
    from datetime import datetime, timedelta, timezone

    from omrl.schema import Annotation

    store = Store.create(tmp_path / "s")
    rows, notes, pairs = [], [], {}
    then = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for r in range(3):
        for i in range(12):
            tid = f"r{r}-{i}"
            reward = ((i * 7) % 12) / 11
            rows.append(Trajectory(id=tid, task_id=f"t{i}", round=r, messages=[Message("user", "go")],
                                   reward=reward, success=reward > 0.5).to_row())
            score = reward + 0.08 * ((i % 3) - 1) if r < 2 else 1 - reward + 0.05 * (i % 2)
            coarse = float(round(reward * 2))  # 0, 1 or 2: many ties
            notes += [Annotation(trajectory_id=tid, annotator="j", score=score, created_at=then).to_row(),
                      Annotation(trajectory_id=tid, annotator="coarse", score=coarse, created_at=then).to_row()]
            pairs.setdefault(("j", r), []).append((score, reward))
            pairs.setdefault(("coarse", r), []).append((coarse, reward))
    # superseded by the newer one above (latest_annotations), errors, labels and rows without a reward
    notes += [Annotation(trajectory_id="r0-1", annotator="j", score=-50.0,
                         created_at=then - timedelta(days=1)).to_row(),
              Annotation(trajectory_id="r1-2", annotator="broken", status="error", error="HTTP 500").to_row(),
              Annotation(trajectory_id="r1-3", annotator="tagger", kind="label", label="good").to_row(),
              Annotation(trajectory_id="nowhere", annotator="j", score=1.0).to_row(),
              Annotation(trajectory_id="noreward", annotator="j", score=0.3, created_at=then).to_row()]
    rows.append(Trajectory(id="noreward", task_id="t0", round=0, messages=[Message("user", "go")],
                           status="env_error", error="env died").to_row())
    store.append(rows)
    store.append(notes, table="annotations")
    return store, pairs


def test_judge_agreement_per_round_matches_scipy_and_flags_the_inverted_round(tmp_path):
    from scipy import stats

    from omrl.report import AGREEMENT_LOW, judge_agreement

    store, pairs = _agreement_store(tmp_path)
    rows = judge_agreement(store)
    assert [(r["annotator"], r["round"]) for r in rows] == sorted(pairs)
    for row in rows:
        scores, rewards = zip(*pairs[(row["annotator"], row["round"])], strict=True)
        assert row["n"] == len(scores) == 12
        assert row["pearson"] == pytest.approx(stats.pearsonr(scores, rewards).statistic, abs=1e-9)
        assert row["spearman"] == pytest.approx(stats.spearmanr(scores, rewards).statistic, abs=1e-9)
        assert row["mean_score"] == pytest.approx(sum(scores) / 12)
    by = {(r["annotator"], r["round"]): r for r in rows}
    assert by[("j", 0)]["pearson"] > 0.9 and by[("j", 0)]["flag"] == by[("j", 1)]["flag"] == ""
    assert by[("j", 2)]["pearson"] < AGREEMENT_LOW
    assert "low" in by[("j", 2)]["flag"] and "fell" in by[("j", 2)]["flag"]
    assert all(by[("coarse", r)]["flag"] == "" for r in range(3))

    md = _report(store.path, tmp_path / "rep")
    table = _md_rows(md, "| annotator | round | n | pearson | spearman |")
    assert [(t["annotator"], t["round"], t["n"]) for t in table] == [(a, str(r), "12") for a, r in sorted(pairs)]
    assert [t["round"] for t in table if t["flag"] not in ("", "-")] == ["2"]
    data = (tmp_path / "rep" / "agreement.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "![judge score against environment reward](agreement.png)" in md
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<h2>Judge vs environment</h2>" in page and page.count("data:image/png;base64,") == 3


def test_agreement_from_omrl_annotate_output_and_none_without_scores(tmp_path):
    """What `omrl annotate` writes today (a metric's score annotations) is read like any judge's."""
    from omrl.cli.main import cli
    from omrl.report import judge_agreement

    store = Store.create(tmp_path / "s")
    store.append([Trajectory(id=f"a{i}", task_id=f"t{i}", round=i % 2,
                             messages=[Message("user", "go")] + [Message("assistant", "up")] * (1 + i % 4),
                             num_turns=1 + i % 4, reward=float(i % 4), success=i % 4 > 1).to_row()
                  for i in range(16)])
    assert judge_agreement(store) == []
    assert "Judge vs environment" not in _report(store.path, tmp_path / "rep0")
    result = CliRunner().invoke(cli, ["annotate", str(store.path), "--metric", "num_turns"])
    assert result.exit_code == 0, result.output
    rows = judge_agreement(store)
    assert [(r["round"], r["n"]) for r in rows] == [(0, 8), (1, 8)]
    # num_turns grows with the reward here, so the rank agreement is perfect in both rounds
    assert all(r["spearman"] == pytest.approx(1.0) for r in rows)


def _step_store(tmp_path, steps: int = 4, per_step: int = 10):
    """GRPO rollouts of one run's round 1, tagged per step as rollout_func tags them (metadata grpo_step,
    run_id .../step-k); judge `j` follows the reward until the last step, then inverts it; `flat` scores
    one constant (no correlation). Returns the store and the pairs per (annotator, optimizer step)."""
    from omrl.schema import Annotation

    store = Store.create(tmp_path / "s")
    rows, notes, pairs = [], [], {}
    for k in range(steps):
        for i in range(per_step):
            tid = f"s{k}-{i}"
            reward = ((i * 3) % per_step) / (per_step - 1)
            rows.append(Trajectory(id=tid, task_id=f"t{i}", round=1, run_id=f"g/round-1/step-{k}",
                                   messages=[Message("user", "go")], reward=reward, success=reward > 0.5,
                                   metadata=json.dumps({"grpo_step": k, "grpo_round": 1})).to_row())
            score = reward + 0.1 * ((i % 3) - 1) if k < steps - 1 else 1 - reward + 0.05 * (i % 2)
            notes += [Annotation(trajectory_id=tid, annotator="j", score=score).to_row(),
                      Annotation(trajectory_id=tid, annotator="flat", score=0.5).to_row()]
            pairs.setdefault(("j", k + 1), []).append((score, reward))  # trained on at step k + 1
            pairs.setdefault(("flat", k + 1), []).append((0.5, reward))
    # an untagged rollout (collect) and a judged rollout without a reward take no part in the steps
    rows += [Trajectory(id="plain", task_id="t0", round=1, messages=[Message("user", "go")], reward=1.0).to_row(),
             Trajectory(id="noreward", task_id="t0", round=1, run_id="g/round-1/step-0", status="env_error",
                        messages=[Message("user", "go")], metadata=json.dumps({"grpo_step": 0})).to_row()]
    notes += [Annotation(trajectory_id="plain", annotator="j", score=1.0).to_row(),
              Annotation(trajectory_id="noreward", annotator="j", score=0.0).to_row()]
    store.append(rows)
    store.append(notes, table="annotations")
    return store, pairs


def test_judge_agreement_per_step_matches_scipy_and_flags_the_step_that_inverts(tmp_path, monkeypatch):
    from scipy import stats

    import omrl.report as report
    from omrl.report import plots

    store, pairs = _step_store(tmp_path)
    rows = report.step_agreement(store)
    assert [(r["annotator"], r["step"]) for r in rows] == sorted(pairs)
    assert {(r["run"], r["round"], r["kind"]) for r in rows} == {("g/round-1", 1, "grpo")}
    for row in rows:
        scores, rewards = zip(*pairs[(row["annotator"], row["step"])], strict=True)
        assert row["n"] == len(scores) == 10
        assert row["mean_score"] == pytest.approx(sum(scores) / 10)
        if row["annotator"] == "flat":  # a constant judge has no correlation: None, never flagged
            assert row["pearson"] is None and row["spearman"] is None and row["flag"] == ""
            continue
        assert row["pearson"] == pytest.approx(stats.pearsonr(scores, rewards).statistic, abs=1e-9)
        assert row["spearman"] == pytest.approx(stats.spearmanr(scores, rewards).statistic, abs=1e-9)
    flags = {r["step"]: r["flag"] for r in rows if r["annotator"] == "j"}
    assert [s for s, f in flags.items() if f] == [4]
    assert "low (r < 0.3)" in flags[4] and "since the previous step" in flags[4]

    titles = []
    real_save = plots._save

    def save(fig, path):
        titles.extend(ax.get_title() for ax in fig.axes if ax.get_visible())
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    md = _report(store.path, tmp_path / "rep")
    assert "judge vs env r" in titles  # the steps plot got its agreement panel
    table = _md_rows(md, "| annotator | run | round | kind | step | n |")
    assert [(t["annotator"], t["step"], t["n"]) for t in table] == [(a, str(s), "10") for a, s in sorted(pairs)]
    assert [(t["annotator"], t["step"]) for t in table if t["flag"] not in ("", "-")] == [("j", "4")]
    assert "<h3>Per training step</h3>" in (tmp_path / "rep" / "report.html").read_text()


def test_long_runs_list_only_the_flagged_steps_and_each_series_end(tmp_path, monkeypatch):
    from omrl.report import sections

    monkeypatch.setattr(sections, "STEP_TABLE_ROWS", 3)
    store, _ = _step_store(tmp_path)
    md = _report(store.path, tmp_path / "rep")
    table = _md_rows(md, "| annotator | run | round | kind | step | n |")
    assert [(t["annotator"], t["step"]) for t in table] == [("flat", "4"), ("j", "4")]
    assert "(2 of 8 rows)" in md


def test_no_step_agreement_without_tagged_rollouts(tmp_path):
    store, _ = _agreement_store(tmp_path)
    from omrl.report import step_agreement

    assert step_agreement(store) == []
    assert "Per training step" not in _report(store.path, tmp_path / "rep")


@pytest.mark.slow
def test_report_renders_a_benchmark_table_and_its_curves(tmp_path):
    from omrl.cli.main import cli
    from omrl.report import benchmark_rows, read_benchmark

    line = {"benchmark": "demo", "seeds": [0, 1], "test_games": 10, "eval": {"samples": 2},
            "methods": {"sft": {"sampled": 0.25, "sampled_ci95": 0.05, "greedy": 0.3, "greedy_ci95": 0.1,
                                "per_seed": [{"greedy": 0.2}, {"greedy": 0.4}], "training_rollouts": 0,
                                "wall_s": [10.0, 12.0], "hyperparameters": {"learning_rate": 0.001}},
                        "grpo": {"sampled": 0.5, "sampled_ci95": 0.06, "greedy": 0.6, "greedy_ci95": 0.08,
                                 "per_seed": [{"greedy": 0.5}, {"greedy": 0.7}], "training_rollouts": 64,
                                 "wall_s": [30.0, 31.0], "hyperparameters": {"learning_rate": 0.0003}}},
            "best_rl_method": "grpo", "best_rl_greedy_gain_points": 30.0, "best_rl_greedy_gain_ci95": 9.0,
            "curves": {"grpo": [[[0, 0.1], [1, 0.3]], [[0, 0.2], [1, 0.4]]]}}
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps(line))
    rows = benchmark_rows(read_benchmark(path))
    assert rows[1] == {"method": "grpo", "sampled": "50.0% ±6.0", "greedy": "60.0% ±8.0",
                       "greedy per seed": "50.0% / 70.0%", "training rollouts": "64", "wall s per seed": "30 / 31",
                       "settings": '{"learning_rate": 0.0003}'}
    store = Store.create(tmp_path / "s")
    store.append([Trajectory(id="a", task_id="t", messages=[Message("user", "go")], reward=1.0).to_row()])
    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "o"),
                                      "--benchmark", str(path)])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| grpo | 50.0% ±6.0 | 60.0% ±8.0 | 50.0% / 70.0% | 64 | 30 / 31 |" in md
    assert "best_rl_greedy_gain_points: 30.0" in md and "![training success per step" in md
    data = (tmp_path / "o" / "benchmark.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert (tmp_path / "o" / "report.html").read_text().count("data:image/png;base64,") == 3
    (tmp_path / "bad.json").write_text('{"methods": 3}')
    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "o"),
                                      "--benchmark", str(tmp_path / "bad.json")])
    assert result.exit_code != 0 and "no `methods` object" in result.output and "Traceback" not in result.output
