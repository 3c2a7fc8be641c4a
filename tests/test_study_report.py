"""`omrl report STUDY_FOLDER`: a study.json (made by omrl.study.figures from synthetic per-seed results) drawn as
study.md / study.html with its contrast and tables, a per-seed dot plot and learning curves from stored rollouts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from click.testing import CliRunner  # noqa: E402

from omrl.cli.main import cli  # noqa: E402
from omrl.study.figures import method_figures  # noqa: E402
from omrl.study.stats import bootstrap_difference  # noqa: E402

TASKS = [f"t{i}" for i in range(10)]
# per method, per seed: how many of the 10 test tasks succeed (greedy); sampled one fewer
SOLVED = {"sft": [2, 3, 2], "more_sft": [4, 3, 5], "grpo": [7, 6, 8]}
KINDS = {"sft": "sft", "more_sft": "more_sft", "grpo": "grpo"}


def _split(solved: int) -> dict:
    greedy = {t: float(i < solved) for i, t in enumerate(TASKS)}
    sampled = {t: float(i < solved - 1) for i, t in enumerate(TASKS)}
    return {"greedy": solved / 10, "sampled": (solved - 1) / 10, "per_task": {"greedy": greedy, "sampled": sampled}}


def _trained() -> dict:
    """What run_condition and score_tests leave per method (the input of method_figures)."""
    methods = {}
    for name, counts in SOLVED.items():
        runs = {seed: {"run": f"{name}-run", "settings": {}, "checkpoint": "x",
                       "compute": {"optimizer_steps": 0 if name == "sft" else 10 + seed, "tokens": 1000 * (seed + 1),
                                   "env_steps": 37 + seed if name == "grpo" else 0, "seconds": 4.5 + seed},
                       "dev": _split(n), "test": _split(n)} for seed, n in enumerate(counts)}
        methods[name] = {"kind": KINDS[name], "chosen": {}, "trained_with": None, "tuning": [], "runs": runs}
    return methods


def make_study(folder, *, conditions=("default",)) -> dict:
    """A study.json as omrl.study.figures.study_result writes it (seed keys as text), in `folder`."""
    trained = _trained()
    groups = {"dev": {}, "test": {}}
    figures = {m: method_figures(trained, m, groups, "greedy") for m in trained}
    diff = bootstrap_difference({s: r["test"]["per_task"]["greedy"] for s, r in trained["grpo"]["runs"].items()},
                                {s: r["test"]["per_task"]["greedy"] for s, r in trained["more_sft"]["runs"].items()})
    study = {"study": "synthetic", "settings_hash": "f00dfeedbeef1234",
             "primary": {"a": "best_rl_on_dev", "b": "more_sft", "metric": "greedy", "condition": conditions[0],
                         "a_resolved": "grpo", "b_resolved": "more_sft"},
             "best_rl_on_dev": "grpo", "primary_contrast_points": round(100 * diff["difference"], 2),
             "primary_contrast_ci95": [round(100 * x, 2) for x in diff["ci"]], "seeds": 3,
             "distinct_test_tasks": 10, "test_train_overlap": 0, "dev_test_overlap": 1, "test_scorings": 1,
             "minutes": 1.5,
             "conditions": {c: {"best_rl_on_dev": "grpo", "sft_stage": {}, "methods": figures} for c in conditions},
             "tuning_compute": {c: {"grpo": {"optimizer_steps": 10, "tokens": 500, "env_steps": 40, "seconds": 3.0,
                                             "runs": 1}} for c in conditions}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps(study, indent=1, default=str))
    return json.loads((folder / "study.json").read_text())


def _report(folder, out, *extra):
    return CliRunner().invoke(cli, ["report", str(folder), "--out", str(out), *extra])


def test_study_page_holds_the_contrast_and_the_tables(tmp_path):
    study = make_study(tmp_path / "study")
    result = _report(tmp_path / "study", tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    md = (out / "study.md").read_text()
    page = (out / "study.html").read_text()
    points, (low, high) = study["primary_contrast_points"], study["primary_contrast_ci95"]
    assert points == pytest.approx(100 * (7.0 - 4.0) / 10)  # grpo 7,6,8 vs more_sft 4,3,5 of 10: +30 points
    contrast = (f"best_rl_on_dev (grpo) minus more_sft, test greedy success, condition default: {points:+.2f} points, "
                f"95% interval [{low:+.2f}, {high:+.2f}] points")
    assert contrast in md and contrast in page
    assert low < points < high
    for text in ("synthetic", "f00dfeedbeef1234"):
        assert text in md and text in page
    # the headline counts, as a table row: seeds, distinct_test_tasks, test_train_overlap, dev_test_overlap, ...
    assert "| 3 | 10 | 0 | 1 | 1 | grpo | 1.500 |" in md
    grpo = study["conditions"]["default"]["methods"]["grpo"]
    test = grpo["test"]["greedy"]
    assert test["per_seed"] == {"0": 0.7, "1": 0.6, "2": 0.8}
    row = next(line for line in md.splitlines() if line.startswith("| grpo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{100 * test['mean']:.1f}%" == "70.0%"
    width = 100 * test["half_width"]
    assert cells[3] == f"± {width:.1f} [{70 - width:.1f}%, {70 + width:.1f}%]"
    assert cells[4] == "0: 70.0%, 1: 60.0%, 2: 80.0%"
    vs_sft, vs_more = grpo["vs_sft"], grpo["vs_more_sft"]
    assert cells[5] == (f"{100 * vs_sft['difference']:+.1f} [{100 * vs_sft['ci'][0]:+.1f}, "
                        f"{100 * vs_sft['ci'][1]:+.1f}]")
    assert cells[5].startswith("+46.7 ")  # 7+6+8 vs 2+3+2 of 30
    assert cells[6] == (f"{100 * vs_more['difference']:+.1f} [{100 * vs_more['ci'][0]:+.1f}, "
                        f"{100 * vs_more['ci'][1]:+.1f}]")
    assert cells[6].startswith(f"{points:+.1f} [")
    assert cells[7] == "3/3 (ties 0, losses 0)"
    assert cells[8:] == ["10 / 11 / 12", "1000 / 2000 / 3000", "37 / 38 / 39", "4.5 / 5.5 / 6.5"]
    sft_row = next(line for line in md.splitlines() if line.startswith("| sft |"))
    assert "| 23.3% |" in sft_row and "0: 20.0%, 1: 30.0%, 2: 20.0%" in sft_row
    # the same cells in the HTML table
    assert "<td>0: 70.0%, 1: 60.0%, 2: 80.0%</td>" in page and "<td>3/3 (ties 0, losses 0)</td>" in page
    assert "Tuning runs" in md
    for png in ("study_seeds.png",):
        data = (out / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"![test greedy success per seed, mean and t interval]({png})" in md
    assert "data:image/png;base64," in page
    assert "No learning curves" in md and not (out / "study_curves.png").exists()
    assert not (out / "report.md").exists()  # the study form, not the store's


def test_learning_curves_from_the_condition_stores(tmp_path):
    from omrl.report.study import study_curves
    from omrl.schema import Message, Trajectory
    from omrl.store import Store

    folder = tmp_path / "study"
    study = make_study(folder, conditions=("default", "noisy"))
    def rollouts(run: str, successes: list[int]) -> list[dict]:
        """Four rollouts per step tagged as GRPO tags them (grpo_step k is trained in update k + 1)."""
        rows = []
        for step, solved in enumerate(successes):
            for i in range(4):
                row = Trajectory(id=f"{run}-{step}-{i}", task_id=f"t{i}", messages=[Message("user", "go")],
                                 reward=float(i < solved), success=i < solved).to_row()
                row["run_id"] = f"{run}/step-{step}"
                row["metadata"] = json.dumps({"grpo_step": step, "grpo_round": 1})
                rows.append(row)
        return rows

    condition = folder / "conditions" / "default-0123abcd"
    # seed 1: no state record, the runs' rollouts are found by their name (NAME/round-1, as train_method stores)
    Store.create(condition / "seed-1" / "store").append(rollouts("grpo-run/round-1", [1, 2, 3]))
    # seed 0: the state file's run_prefix picks the run's rollouts, not another run of a similar name
    Store.create(condition / "seed-0" / "store").append(rollouts("grpo-run/round-1", [4, 4])
                                                        + rollouts("grpo-run/attempt-2", [0, 2]))
    (condition / "benchmark_state.json").write_text(json.dumps({"stages": [
        {"stage": "seed0/train/grpo-run", "run_prefix": "grpo-run/attempt-2"}]}))
    Store.create(folder / "conditions" / "default-old" / "seed-7" / "store")  # no seed of this study: not read
    curves = study_curves(folder, study)
    assert curves == {"default": {"grpo": {"0": [[1, 0.0], [2, 0.5]], "1": [[1, 0.25], [2, 0.5], [3, 0.75]]}}}
    result = _report(folder, tmp_path / "out")
    assert result.exit_code == 0, result.output
    data = (tmp_path / "out" / "study_curves.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5000
    md = (tmp_path / "out" / "study.md").read_text()
    assert "![training success per step](study_curves.png)" in md and "No learning curves" not in md
    assert "## Condition: default" in md and "## Condition: noisy" in md


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"study": "x"}),
                                  json.dumps({"study": "x", "settings_hash": "h", "primary": {"a": "a"},
                                              "primary_contrast_points": 1, "primary_contrast_ci95": [0, 2],
                                              "seeds": 1, "conditions": {}}),
                                  "figure of the wrong shape"])
def test_a_damaged_study_file_is_a_one_line_error(tmp_path, text):
    if text == "figure of the wrong shape":
        study = make_study(tmp_path / "study")
        study["conditions"]["default"]["methods"]["grpo"]["test"]["greedy"] = 0.7
        text = json.dumps(study)
    else:
        (tmp_path / "study").mkdir()
    (tmp_path / "study" / "study.json").write_text(text)
    result = _report(tmp_path / "study", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (ValueError, KeyError, TypeError))
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "study.json" in lines[0], result.output


def test_store_options_are_refused_for_a_study_folder(tmp_path):
    make_study(tmp_path / "study")
    result = _report(tmp_path / "study", tmp_path / "out", "--runs", str(tmp_path / "study"))
    assert result.exit_code == 2 and "--runs" in result.output and "study folder" in result.output
    assert "omrl report runs/study-quick --out" in CliRunner().invoke(cli, ["report", "--help"]).output


def test_a_study_cut_short_reports_its_finished_conditions_and_names_the_pending_ones(tmp_path):
    study = make_study(tmp_path / "study")
    study.update(primary_contrast_points=None, primary_contrast_ci95=None, pending_conditions=["gold", "few"])
    (tmp_path / "study" / "study.json").write_text(json.dumps(study))
    result = _report(tmp_path / "study", tmp_path / "out")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "out" / "study.md").read_text()
    assert "condition default: - points, 95% interval [-, -] points" in md  # no contrast yet, not a 0
    assert "Not run yet (the study stopped before them; resume it to add them): gold, few" in md
    assert "## Condition: default" in md and "## Condition: gold" not in md
