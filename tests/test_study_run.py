"""`omrl study run` (omrl.study.run): the quick study end to end (real trainers, tiny model), its resume, the test
ledger's refusal of a second scoring under changed settings and --rescore; the refusals made before anything
trains (a held-out task seen in train, a budget the runner cannot match, a grid on the budget's key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.errors import UsageError
from omrl.study.ledger import RescoreRefused, TestLedger
from omrl.study.run import (
    base_recipe,
    budget_settings,
    check_runnable,
    flatten,
    frozen_hash,
    grid_points,
    preflight,
    run_study,
    unflatten,
)
from omrl.study.spec import load_study, settings_hash
from omrl.train.config.iterate import IterateRecipe
from tests.study_helpers import tiny_study

QUICK = "shipped:studies/quick"


def _json_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_study_s_recipe_is_its_runs_starting_point_read_beside_the_study_file(tmp_path):
    (tmp_path / "mine.yaml").write_text("rounds: 3\nrollout: {env: math, max_turns: 7}\n")
    spec = load_study(tiny_study(tmp_path, copied=False, extra="recipe: mine.yaml\n"))
    recipe = base_recipe(spec, tmp_path)
    assert recipe["rounds"] == 3 and recipe["rollout"]["max_turns"] == 7
    assert recipe["rollout"]["env"] == "grid"  # the study's environment replaces the recipe's
    assert base_recipe(load_study(tiny_study(tmp_path, copied=False)), tmp_path)["rounds"] == 2  # shipped:quickstart
    with pytest.raises(Exception, match="missing.yaml"):
        base_recipe(load_study(tiny_study(tmp_path, copied=False, extra="recipe: missing.yaml\n")), tmp_path)


def test_editing_a_file_the_study_names_changes_what_the_ledger_keys_scorings_by(tmp_path):
    from omrl.study.tasksets import screened_task_sets

    (tmp_path / "mine.yaml").write_text("rounds: 1\n")
    spec = load_study(tiny_study(tmp_path, copied=False, extra="recipe: mine.yaml\n"))
    before = frozen_hash(spec, tmp_path, screened_task_sets(spec, tmp_path)[0])
    assert before.startswith(settings_hash(spec)) and before == frozen_hash(spec, tmp_path,
                                                                            screened_task_sets(spec, tmp_path)[0])
    (tmp_path / "mine.yaml").write_text("rounds: 2\n")  # the recipe edited after the test set was scored
    after_recipe = frozen_hash(spec, tmp_path, screened_task_sets(spec, tmp_path)[0])
    tasks = tmp_path / "tasks.jsonl"
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    rows[0]["instruction"] += " (edited)"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after_tasks = frozen_hash(spec, tmp_path, screened_task_sets(spec, tmp_path)[0])
    assert len({before, after_recipe, after_tasks}) == 3 and settings_hash(spec) == before.split("-")[0]


def test_a_study_whose_test_set_copies_a_train_task_is_refused_before_anything_runs(tmp_path):
    study = tiny_study(tmp_path, copied=True)
    out = tmp_path / "out"
    refused = CliRunner().invoke(cli, ["study", "run", str(study), "--out", str(out)])
    assert refused.exit_code == 1, refused.output
    report = _json_lines(refused.output)[0]
    assert report["refused"] is True and report["test_train_overlap"] == 1
    assert "test task 'test-copy'" in refused.output
    assert not (out / "conditions").exists() and not (out / "test_ledger.jsonl").exists()


def test_what_the_runner_cannot_do_is_refused_up_front(tmp_path):
    study = tiny_study(tmp_path, copied=False)
    with pytest.raises(UsageError, match="budget.unit 'env_steps': omrl study run matches optimizer_steps only"):
        check_runnable(load_study(study, ["budget.unit=env_steps"]))
    with pytest.raises(UsageError, match=r"method more_sft: grid.epochs is set by the budget \(2 optimizer_steps\)"):
        check_runnable(load_study(study, ["methods.more_sft={kind: more_sft, grid: {epochs: [1, 2]}}"]))
    with pytest.raises(UsageError, match="method more_sft: grid.sft.learning_rate is not a setting of a more_sft run"):
        check_runnable(load_study(study, ["methods.more_sft={kind: more_sft, grid: {sft.learning_rate: [1e-3]}}"]))
    with pytest.raises(UsageError, match="method grpo: grid.learnin_rate is not a setting of a grpo run"):
        check_runnable(load_study(study, ["methods.grpo={kind: grpo, grid: {learnin_rate: [1e-4]}}"]))
    check_runnable(load_study(study, ["methods.rft={kind: rft, grid: {sft.learning_rate: [1e-3], samples: [4]}}"]))
    with pytest.raises(UsageError, match=r"method it: grid.grpo.max_steps is set by the budget"):
        check_runnable(load_study(study, ["methods.it={kind: iterate, grid: {grpo.max_steps: [4]}}"]))
    check_runnable(load_study(study, ["methods.it={kind: iterate, grid: {rounds: [2], collect.samples: [4]}}"]))
    with pytest.raises(UsageError, match="method sft: sft trains nothing"):
        check_runnable(load_study(study, ["methods.sft={kind: sft, grid: {learning_rate: [1e-3]}}"]))
    with pytest.raises(UsageError, match="condition default: eval.greedy false, but the primary metric is greedy"):
        check_runnable(load_study(study, ["conditions={default: {overrides: {eval.greedy: false}}}"]))
    check_runnable(load_study(study))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["study", "run", str(study), "--out", str(out), "budget.unit=tokens"])
    assert result.exit_code == 1 and "matches optimizer_steps only" in result.output
    assert not (out / "conditions").exists()


def test_grids_and_budgets_map_onto_recipe_keys(tmp_path):
    assert grid_points({}) == [{}]
    assert grid_points({"learning_rate": [1, 2], "step_credit.weight": [0, 3]}) == [
        {"learning_rate": 1, "step_credit.weight": 0}, {"learning_rate": 1, "step_credit.weight": 3},
        {"learning_rate": 2, "step_credit.weight": 0}, {"learning_rate": 2, "step_credit.weight": 3}]
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}
    assert unflatten({"a.b": 1, "a.c.d": 2, "e": 3}) == {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
    spec = load_study(tiny_study(tmp_path, copied=False), ["budget.value=20"])
    recipe = IterateRecipe(output_dir="o", train_tasks="t", eval_tasks="e")  # PPO: 4 epochs x 2 minibatches per batch
    assert budget_settings(spec, "grpo", recipe, {}) == {"max_steps": 20}
    assert budget_settings(spec, "more_sft", recipe, {}) == {"max_steps": 20}
    assert budget_settings(spec, "rft", recipe, {}) == {"sft.max_steps": 20}
    assert budget_settings(spec, "sft", recipe, {}) == {}
    assert budget_settings(spec, "ppo_turn", recipe, {}) == {"max_steps": 2}  # 20 // 8
    assert budget_settings(spec, "ppo_token", recipe, {"ppo_epochs": 1, "minibatches": 2}) == {"max_steps": 10}
    assert budget_settings(spec, "ppo_token", recipe, {"ppo_epochs": 30}) == {"max_steps": 1}
    assert budget_settings(spec, "iterate", recipe, {"rounds": 3}) == {"grpo.max_steps": 6}  # 20 // 3 a round


def test_a_test_set_scored_under_other_settings_refuses_a_run_before_it_trains(tmp_path):
    ledger = TestLedger(tmp_path)
    preflight(ledger, "aaaa", rescore=False)  # nothing scored yet
    ledger.record("aaaa", {"method": "sft", "seed": 0})
    preflight(ledger, "aaaa", rescore=False)  # the same settings: a resumed run
    with pytest.raises(RescoreRefused, match="scored under settings aaaa; these settings are bbbb: pass --rescore"):
        preflight(ledger, "bbbb", rescore=False)
    preflight(ledger, "bbbb", rescore=True)


def _state_files(out: Path) -> dict[Path, str]:
    """Every resumable run's record: the condition's benchmark_state.json and each seed's iterate state.json."""
    paths = sorted(out.glob("conditions/*/benchmark_state.json")) + sorted(out.glob("conditions/*/seed-*/state.json"))
    return {path: path.read_text() for path in paths}


@pytest.mark.slow
def test_the_quick_study_runs_resumes_and_scores_its_test_set_once(tmp_path):
    out = tmp_path / "quick"
    first = CliRunner().invoke(cli, ["study", "run", QUICK, "--out", str(out)])
    assert first.exit_code == 0, first.output
    report, head = _json_lines(first.output)[0], _json_lines(first.output)[-1]
    assert (report["distinct_test_tasks"], report["dev_tasks"], report["test_train_overlap"]) == (16, 10, 0)
    study = json.loads((out / "study.json").read_text())
    assert head == {key: study[key] for key in head}
    spec = load_study(QUICK)
    assert study["settings_hash"] == settings_hash(spec) and study["spec"]["name"] == "quick"
    assert (study["seeds"], study["distinct_test_tasks"], study["test_train_overlap"], study["dev_test_overlap"],
            study["test_scorings"]) == (2, 16, 0, 0, 1)
    assert study["overlap"]["dropped_test_tasks"] == 0
    methods = study["conditions"]["default"]["methods"]
    assert list(methods) == ["sft", "more_sft", "grpo"] and study["best_rl_on_dev"] == "grpo"
    for figures in methods.values():
        for split in ("dev", "test"):
            for mode in ("greedy", "sampled"):
                figure = figures[split][mode]
                per_seed = list(figure["per_seed"].values())
                assert len(per_seed) == 2 and figure["seeds"] == 2 and figure["half_width"] is not None
                assert figure["mean"] == pytest.approx(sum(per_seed) / 2)
                assert per_seed == pytest.approx([figures["runs"][seed][f"{split}_{mode}"] for seed in ("0", "1")],
                                                 abs=1e-4)  # per task (stats) = per episode (eval): same samples
        assert set(figures["runs"]) == {"0", "1"}
    steps = {name: [figures["runs"][s]["compute"]["optimizer_steps"] for s in ("0", "1")]
             for name, figures in methods.items()}
    assert steps == {"sft": [0, 0], "more_sft": [10, 10], "grpo": [10, 10]}  # the budget, matched
    for seed in ("0", "1"):
        grpo = methods["grpo"]["runs"][seed]["compute"]
        assert grpo["env_steps"] > 0 and grpo["tokens"] > 0 and grpo["seconds"] > 0
        assert methods["more_sft"]["runs"][seed]["compute"]["tokens"] > 0
    assert methods["grpo"]["tuning"][0]["settings"] == {"learning_rate": 0.0002}
    assert study["tuning_compute"]["default"]["grpo"]["optimizer_steps"] == 10  # one grid point, on seed 0
    sft_stage = study["conditions"]["default"]["sft_stage"]
    assert set(sft_stage) == {"0", "1"} and all(s["seconds"] > 0 and s["epochs"] == 12 for s in sft_stage.values())
    for name in ("more_sft", "grpo"):
        assert methods[name]["vs_sft"]["method"] == "sft" and len(methods[name]["vs_sft"]["ci"]) == 2
    won = methods["grpo"]["seeds_won_vs_more_sft"]
    assert won["wins"] + won["ties"] + won["losses"] == 2 and "vs_more_sft" not in methods["more_sft"]
    # the primary contrast: grpo minus more SFT, greedy, on test, in points (every task common: the mean difference)
    gap = methods["grpo"]["test"]["greedy"]["mean"] - methods["more_sft"]["test"]["greedy"]["mean"]
    assert study["primary_contrast_points"] == pytest.approx(100 * gap, abs=0.01)
    low, high = study["primary_contrast_ci95"]
    assert low <= study["primary_contrast_points"] <= high
    ledger = TestLedger(out)
    assert ledger.test_scorings == 1 and len(ledger.entries()) == 6  # 3 methods x 2 seeds, each before its scoring
    assert {(e["what"]["method"], e["what"]["seed"]) for e in ledger.entries()} == {
        (m, s) for m in methods for s in (0, 1)}

    # omrl study status: what finished (grpo and more_sft trained on 2 seeds; sft, more_sft and grpo on dev and
    # test each), nothing running; a claim left by a process that is gone is shown stale, a live one as running
    [folder] = (out / "conditions").iterdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / "claims").mkdir(exist_ok=True)
    (folder / "claims" / "seed1__train__grpo-x.pid").write_text(gone.stdout.strip())
    (folder / "claims" / "seed1__test__grpo-x.pid").write_text(str(os.getpid()))
    shown = CliRunner().invoke(cli, ["study", "status", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    status = json.loads(shown.output)
    condition = status["conditions"][folder.name]
    assert (condition["trained"], condition["dev_evaluations"], condition["test_evaluations"]) == (4, 6, 6)
    assert condition["hours"] > 0 and condition["last_finished"].startswith("seed1/test/")
    assert [c["key"] for c in condition["running"]] == ["seed1/test/grpo-x"]
    assert [c["key"] for c in condition["stale_claims"]] == ["seed1/train/grpo-x"]
    assert status["test_scorings"] == 1 and status["pending_conditions"] == []
    lines = CliRunner().invoke(cli, ["study", "status", str(out)])
    assert lines.exit_code == 0 and "stale claim: seed1/train/grpo-x" in lines.output
    assert f"{folder.name}: 4 trained, 6 dev and 6 test evaluations" in lines.output
    for claim in (folder / "claims").glob("*-x.pid"):
        claim.unlink()

    # started again: every run is found recorded, nothing is trained or evaluated again
    before = _state_files(out)
    assert len(before) == 3
    lines: list[str] = []
    again = run_study(spec, out, log=lines.append)
    assert _state_files(out) == before
    assert {k: again[k] for k in head if k != "minutes"} == {k: head[k] for k in head if k != "minutes"}
    assert ledger.test_scorings == 1 and len(ledger.entries()) == 6  # the same scorings, not recorded twice

    # a changed setting: refused before anything runs, then accepted with --rescore (a second scoring)
    refused = CliRunner().invoke(cli, ["study", "run", QUICK, "--out", str(out), "primary.metric=sampled"])
    assert refused.exit_code == 1 and "pass --rescore" in refused.output
    assert ledger.test_scorings == 1 and len(ledger.entries()) == 6
    rescored = CliRunner().invoke(cli, ["study", "run", QUICK, "--out", str(out), "primary.metric=sampled",
                                        "--rescore"])
    assert rescored.exit_code == 0, rescored.output
    head = _json_lines(rescored.output)[-1]
    assert head["test_scorings"] == 2 and head["primary"]["metric"] == "sampled"
    assert head["settings_hash"] == settings_hash(load_study(QUICK, ["primary.metric=sampled"]))
    assert json.loads((out / "study.json").read_text())["test_scorings"] == 2
    assert len(ledger.entries()) == 12  # each run scored again under the new settings, recorded as such
    assert _state_files(out) == before  # the runs did not change: only the reading of them did


KINDS_STUDY = """
name: kinds
env: grid
env_options: {noise: 0.3, seed: 0}
tasks: {train: "shipped:grid_train[:100]", dev: "shipped:grid_eval[:4]", test: "shipped:grid_eval[100:104]"}
methods:
  sft: sft
  more_sft: {kind: more_sft, grid: {learning_rate: [0.001]}}
  rft: {kind: rft, grid: {learning_rate: [0.001], samples: [4], threshold: [0.0]}}
  step_credit: {kind: step_credit, grid: {learning_rate: [0.0002], step_credit.weight: [2.0]}}
  ppo_turn: {kind: ppo_turn, grid: {learning_rate: [0.0001]}}
  ppo_token: {kind: ppo_token, grid: {learning_rate: [0.0001], ppo_epochs: [1]}}
  iterate: {kind: iterate, grid: {rounds: [2], grpo.learning_rate: [0.0002]}}
budget: {unit: optimizer_steps, value: 4}
seeds: 2
conditions:
  noisy: {overrides: &tiny {tiny.hidden: 32, tiny.corpus: demos, sft.epochs: 3, sft.batch_size: 16,
                            grpo.tasks_per_step: 2, grpo.samples_per_task: 4, grpo.warmup_steps: 0,
                            ppo.minibatches: 1, eval.samples: 1, rollout.concurrency: 16, collect.tasks: 16}}
  gold: {overrides: {<<: *tiny, rollout.env_options.noise: 0.0}}
primary: {a: best_rl_on_dev, b: more_sft, metric: sampled, condition: gold}
"""


@pytest.mark.slow
def test_every_method_kind_trains_at_the_matched_budget_under_each_condition(tmp_path):
    (tmp_path / "kinds.yaml").write_text(KINDS_STUDY)
    lines: list[str] = []
    snapshots: list[dict] = []  # study.json as it stood when the second condition started

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("condition gold:"):
            snapshots.append(json.loads((tmp_path / "out" / "study.json").read_text()))

    study = run_study(load_study(tmp_path / "kinds.yaml"), tmp_path / "out", base=tmp_path, log=log)
    assert list(study["conditions"]) == ["noisy", "gold"] and study["test_scorings"] == 1
    assert study["pending_conditions"] == [] and study["primary_contrast_points"] is not None
    # the first condition's test set was scored before the second started, and study.json said so
    gold_starts = lines.index(next(line for line in lines if line.startswith("condition gold:")))
    assert any(": test sampled " in line for line in lines[:gold_starts])
    assert not any(": test sampled " in line for line in lines[gold_starts:gold_starts + 3])
    [partial] = snapshots
    assert list(partial["conditions"]) == ["noisy"] and partial["pending_conditions"] == ["gold"]
    assert partial["primary_contrast_points"] is None and partial["best_rl_on_dev"] is None  # the primary's is gold
    assert partial["test_scorings"] == 1
    folders = sorted(p.name.split("-")[0] for p in (tmp_path / "out" / "conditions").iterdir())
    assert folders == ["gold", "noisy"]  # each condition's own runs
    for condition in study["conditions"].values():
        methods = condition["methods"]
        for name in ("more_sft", "rft", "step_credit", "ppo_turn", "ppo_token", "iterate"):
            for run in methods[name]["runs"].values():  # PPO: 1 batch x 4 epochs, 4 batches x 1 epoch; iterate:
                assert run["compute"]["optimizer_steps"] == 4, (name, run)  # 2 rounds of 2 GRPO steps
                assert run["compute"]["seconds"] > 0
        for name in ("rft", "step_credit", "ppo_turn", "ppo_token", "iterate"):  # they play episodes; SFT does not
            assert all(run["compute"]["env_steps"] > 0 for run in methods[name]["runs"].values()), name
        assert all(run["compute"]["env_steps"] == 0 for run in methods["more_sft"]["runs"].values())
        assert methods["ppo_turn"]["runs"]["0"]["run"] == "ppo_turn-lr0.0001-max_steps1"
        assert methods["step_credit"]["chosen"] == {"learning_rate": 0.0002, "step_credit.weight": 2.0}
        assert condition["best_rl_on_dev"] in ("step_credit", "ppo_turn", "ppo_token", "iterate")  # rft: a baseline
        assert methods["iterate"]["runs"]["1"]["run"].startswith("iterate-rounds2-")
    assert study["primary"]["a_resolved"] == study["conditions"]["gold"]["best_rl_on_dev"]
    recipes = {p.parent.parent.name.split("-")[0]: json.loads(p.read_text())["rollout"]["env_options"]["noise"]
               for p in (tmp_path / "out" / "conditions").glob("*/seed-0/recipe.json")}
    assert recipes == {"noisy": 0.3, "gold": 0.0}  # the condition's override reached the runs


TINY_RECIPE = ("conditions: {default: {overrides: {tiny.hidden: 16, tiny.corpus: demos, sft.epochs: 2, "
               "grpo.tasks_per_step: 2, grpo.samples_per_task: 2, grpo.warmup_steps: 0, eval.samples: 1}}}\n")


def _stages(out: Path) -> list[dict]:
    [state] = out.glob("conditions/*/benchmark_state.json")
    return json.loads(state.read_text())["stages"]


@pytest.mark.slow
def test_a_study_killed_midway_resumes_without_redoing_its_finished_runs(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    study = tiny_study(tmp_path, copied=False, extra=TINY_RECIPE)
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "omrl", "study", "run", str(study), "--out", str(out)], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            states = list(out.glob("conditions/*/benchmark_state.json"))
            if states and any("/train/" in s["stage"] for s in _stages(out)):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup, as a crash or an OOM kill
    finally:
        proc.wait(timeout=60)
    before = _stages(out)
    assert any("/train/" in s["stage"] for s in before) and not (out / "study.json").exists()
    assert TestLedger(out).test_scorings == 0  # killed before the test set was scored
    lines: list[str] = []
    result = run_study(load_study(study), out, base=tmp_path, log=lines.append)
    after = _stages(out)
    assert after[: len(before)] == before  # every finished run kept as it was
    names = [s["stage"] for s in after]
    assert len(names) == len(set(names))  # and none made twice
    assert result["test_scorings"] == 1 and (out / "study.json").exists()
    assert set(result["conditions"]["default"]["methods"]) == {"sft", "more_sft", "grpo"}


FROM_BASE_STUDY = """
name: from_base
env: grid
env_options: {noise: 0.3, seed: 0}
tasks: {train: "shipped:grid_train[:60]", dev: "shipped:grid_eval[:3]", test: "shipped:grid_eval[100:103]"}
methods:
  base: base
  sft: sft
  grpo: {kind: grpo, grid: {learning_rate: [0.0002]}}
  grpo_base: {kind: grpo, start: base, grid: {learning_rate: [0.0002]}}
budget: {unit: optimizer_steps, value: 2}
seeds: 2
""" + TINY_RECIPE + "primary: {a: grpo_base, b: base, metric: greedy}\n"


def test_the_base_model_is_a_method_and_rl_may_start_from_it(tmp_path):
    (tmp_path / "study.yaml").write_text(FROM_BASE_STUDY)
    spec = load_study(tmp_path / "study.yaml")
    study = run_study(spec, tmp_path / "out", base=tmp_path)
    methods = study["conditions"]["default"]["methods"]
    assert study["primary"]["a_resolved"] == "grpo_base" and study["test_scorings"] == 1
    [folder] = (tmp_path / "out" / "conditions").iterdir()
    for seed in ("0", "1"):
        base = json.loads((folder / f"seed-{seed}" / "state.json").read_text())
        starts = {s["stage"]: s["checkpoint"] for s in base["stages"] if s["stage"] in ("base", "sft")}
        assert methods["base"]["runs"][seed]["run"] == "base"
        assert methods["base"]["runs"][seed]["compute"]["optimizer_steps"] == 0  # evaluated, not trained
        # each GRPO run trained from its own start: grpo from SFT, grpo_base from the untrained model
        for name, start in (("grpo", starts["sft"]), ("grpo_base", starts["base"])):
            run = methods[name]["runs"][seed]
            assert run["compute"]["optimizer_steps"] == 2
            saved = json.loads((folder / f"seed-{seed}" / "study" / run["run"] / "omrl_grpo.json").read_text())
            assert saved["recipe"]["model"] == start, name
    with pytest.raises(UsageError, match="method base: base trains nothing"):
        check_runnable(load_study(tmp_path / "study.yaml", ["methods.base.kind=base",
                                                             "methods.base.grid.learning_rate=[0.1]"]))
