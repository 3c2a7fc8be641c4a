"""`omrl report STUDY_FOLDER`: a study's page (study.md, study.html), its per-seed dot plot and its learning curves.

    paths = write_study_report("runs/study-quick", "runs/study-quick/report")

Reads what `omrl study run` writes (FOLDER/study.json, omrl.study.figures): the primary contrast as declared and
its value, the screening counts, per condition a table of methods (seed-level mean and t interval on test, per
seed, the bootstrap differences to sft and more_sft, seeds won vs more_sft, compute per seed). The learning
curves are the training success per step of each RL run's stored rollouts (what omrl.study.compare's
training_curve reads), found in the condition folders beside study.json (FOLDER/conditions/NAME-DIGEST/seed-N/
store); study.json itself holds no per-step records, so without those folders the page says there are none.
(The report layer sits below omrl.study: nothing here imports it.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.report.plots import _plt, _save
from omrl.report.sections import _table_md
from omrl.report.steps import stored_step_stats
from omrl.report.writer import _html
from omrl.store.study_folder import STATE_FILE, STUDY_FILE, condition_folders, seed_folder, seed_store

REQUIRED = ("study", "settings_hash", "primary", "primary_contrast_points", "primary_contrast_ci95", "seeds",
            "conditions")
COMPUTE = ("optimizer_steps", "tokens", "env_steps", "seconds")
TABLE_COLUMNS = ("method", "kind", "mean", "t interval", "per seed", "vs sft (points)", "vs more_sft (points)",
                 "seeds won vs more_sft", *(f"{unit} (per seed)" for unit in COMPUTE))


def is_study_folder(path: str | Path) -> bool:
    """Whether `path` is a study's output folder (it holds study.json) rather than a store."""
    return (Path(path) / STUDY_FILE).is_file()


def read_study(folder: str | Path) -> dict[str, Any]:
    """FOLDER/study.json, checked for what the page reads; UsageError (one line) when it is damaged."""
    path = Path(folder) / STUDY_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable study file ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a study file is a JSON object, got {type(data).__name__}")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise UsageError(f"{path}: not a study file written by omrl study run (no {', '.join(missing)})")
    primary, conditions = data["primary"], data["conditions"]
    if not isinstance(primary, dict) or not all(k in primary for k in ("a", "b", "metric", "condition")):
        raise UsageError(f"{path}: primary must hold a, b, metric and condition")
    if not isinstance(conditions, dict) or not conditions:
        raise UsageError(f"{path}: conditions must be a non-empty object")
    for name, condition in conditions.items():
        methods = condition.get("methods") if isinstance(condition, dict) else None
        if not isinstance(methods, dict) or not methods or not all(
                isinstance(m, dict) and isinstance(m.get("test"), dict) for m in methods.values()):
            raise UsageError(f"{path}: condition {name!r} has no methods with test figures")
    return data


# ---------------------------------------------------------------- figures as text

def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def _difference(figure: dict[str, Any] | None) -> str:
    """A bootstrap difference (fractions) in points with its interval: '+6.2 [-1.0, +12.5]'."""
    if not figure or figure.get("difference") is None:
        return "-"
    low, high = (figure.get("ci") or [None, None])[:2]
    return f"{_points(figure['difference'])} [{_points(low)}, {_points(high)}]"


def _seed_key(seed: Any) -> tuple[int, Any]:
    text = str(seed)
    return (0, int(text)) if text.lstrip("-").isdigit() else (1, text)


def _per_seed(figure: dict[str, Any]) -> list[tuple[str, float]]:
    return [(str(s), v) for s, v in sorted((figure.get("per_seed") or {}).items(), key=lambda kv: _seed_key(kv[0]))]


def condition_table(study: dict[str, Any], condition: str) -> list[dict[str, Any]]:
    """One row per method of `condition`: the TABLE_COLUMNS on the primary metric (test), as text."""
    metric = study["primary"]["metric"]
    rows = []
    for name, method in study["conditions"][condition]["methods"].items():
        figure = method["test"].get(metric) or {}
        width = figure.get("half_width")
        mean = figure.get("mean")
        won = method.get("seeds_won_vs_more_sft")
        runs = sorted((method.get("runs") or {}).items(), key=lambda kv: _seed_key(kv[0]))
        row = {"method": name, "kind": method.get("kind", "-"), "mean": _pct(mean),
               "t interval": "-" if mean is None or width is None
               else f"± {100 * width:.1f} [{_pct(mean - width)}, {_pct(mean + width)}]",
               "per seed": ", ".join(f"{s}: {_pct(v)}" for s, v in _per_seed(figure)) or "-",
               "vs sft (points)": _difference(method.get("vs_sft")),
               "vs more_sft (points)": _difference(method.get("vs_more_sft")),
               "seeds won vs more_sft": "-" if not won else
               f"{won.get('wins')}/{won.get('seeds')} (ties {won.get('ties')}, losses {won.get('losses')})"}
        for unit in COMPUTE:
            values = [(run.get("compute") or {}).get(unit) for _, run in runs]
            row[f"{unit} (per seed)"] = " / ".join("-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
                                                   for v in values) or "-"
        rows.append(row)
    return rows


def contrast_line(study: dict[str, Any]) -> str:
    """The primary contrast as declared and its value: 'best_rl_on_dev (grpo) minus more_sft, ...'."""
    p = study["primary"]

    def side(key: str) -> str:
        resolved = p.get(f"{key}_resolved")
        return p[key] if not resolved or resolved == p[key] else f"{p[key]} ({resolved})"

    low, high = (study.get("primary_contrast_ci95") or [None, None])[:2]
    value = study.get("primary_contrast_points")

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:+.2f}"

    return (f"Primary contrast: {side('a')} minus {side('b')}, test {p['metric']} success, condition "
            f"{p['condition']}: {fmt(value)} points, 95% interval [{fmt(low)}, {fmt(high)}] points")


# ---------------------------------------------------------------- plots

def plot_study_seeds(study: dict[str, Any], path: Path) -> Path:
    """Per condition a panel: per method one dot per seed (test, the primary metric), its mean and t interval."""
    metric = study["primary"]["metric"]
    conditions = study["conditions"]
    plt = _plt()
    fig, axes = plt.subplots(1, len(conditions), figsize=(max(4.5, 1.2 * max(
        len(c["methods"]) for c in conditions.values()) + 2) * len(conditions), 4), squeeze=False)
    for ax, (name, condition) in zip(axes.flat, conditions.items(), strict=True):
        methods = list(condition["methods"].items())
        for x, (_, entry) in enumerate(methods):
            figure = entry["test"].get(metric) or {}
            values = [v for _, v in _per_seed(figure) if v is not None]
            offsets = [(i - (len(values) - 1) / 2) * 0.08 for i in range(len(values))]
            ax.scatter([x + o for o in offsets], [100 * v for v in values], s=28, color=f"C{x}", alpha=0.75,
                       zorder=3, label="per seed" if x == 0 else None)
            if figure.get("mean") is not None:
                width = figure.get("half_width")
                ax.errorbar([x + 0.28], [100 * figure["mean"]],
                            yerr=None if width is None else [[100 * width], [100 * width]], fmt="D", color="black",
                            capsize=5, markersize=5, label="mean ± 95% t interval" if x == 0 else None)
                if width is not None and (figure["mean"] - width < 0 or figure["mean"] + width > 1):
                    ax.annotate(f"±{100 * width:.0f}", (x + 0.3, 97), fontsize="x-small", ha="left", va="top")
        ax.set_xticks(range(len(methods)), [m for m, _ in methods])
        ax.set_xlim(-0.5, len(methods) - 0.35)  # room for the last method's bar and its note
        ax.set(title=f"{name}: test {metric} success per seed", ylabel="success (%)", ylim=(-3, 103))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    return _save(fig, path)


def newest_condition_folder(folder: Path, name: str, seeds: list[str]) -> Path | None:
    """The condition's run folder under FOLDER/conditions (NAME-DIGEST); the newest when a changed recipe left
    several; None when there is none."""
    found = [p for p in condition_folders(folder, name)
             if p.name[len(name) + 1:].isalnum() and any(seed_folder(p, s).is_dir() for s in seeds)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def study_curves(folder: str | Path, study: dict[str, Any]) -> dict[str, dict[str, dict[str, list[list[float]]]]]:
    """{condition: {method: {seed: [[step, success], ...]}}}: the training success per step of each run's stored
    rollouts (RL runs tag theirs with their step), from the condition folders' per-seed stores. Empty when the
    folders are gone or no run stored per-step rollouts."""
    from omrl.store import Store

    folder = Path(folder)
    curves: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for name, condition in study["conditions"].items():
        methods = condition["methods"]
        seeds = sorted({str(s) for m in methods.values() for s in (m.get("runs") or {})}, key=_seed_key)
        where = newest_condition_folder(folder, name, seeds)
        if where is None:
            continue
        prefixes = _run_prefixes(where)
        for seed in seeds:
            store_path = seed_store(where, seed)
            if not (store_path / "omrl.json").is_file():
                continue
            steps = stored_step_stats(Store(store_path))
            for method, entry in methods.items():
                run = ((entry.get("runs") or {}).get(seed) or {}).get("run")
                if not run:
                    continue
                prefix = prefixes.get(f"seed{seed}/train/{run}")
                points = [[r["step"], r["success_rate"]] for r in steps if r["success_rate"] is not None
                          and (r["run"] == prefix if prefix else r["run"] == run or r["run"].startswith(run + "/"))]
                if points:
                    curves.setdefault(name, {}).setdefault(method, {})[seed] = points
    return curves


def _run_prefixes(where: Path) -> dict[str, str]:
    """Each training record's run prefix (the run id its stored rollouts carry, e.g. NAME/round-1) by its key
    (seedS/train/NAME) in the condition's STATE_FILE; {} when it is missing or unreadable."""
    try:
        stages = json.loads((where / STATE_FILE).read_text()).get("stages")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return {}
    return {r["stage"]: r["run_prefix"] for r in stages or [] if isinstance(r, dict)
            and isinstance(r.get("stage"), str) and isinstance(r.get("run_prefix"), str)}


def plot_study_curves(curves: dict[str, dict[str, dict[str, list[list[float]]]]], path: Path) -> Path:
    """Per condition a panel: training success per step, a colour per method, a line style per seed."""
    plt = _plt()
    cols = min(3, len(curves))
    rows = math.ceil(len(curves) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    styles = ("-", "--", ":", "-.")
    for ax, (name, methods) in zip(axes.flat, curves.items(), strict=False):
        for i, (method, seeds) in enumerate(methods.items()):
            for j, (seed, points) in enumerate(seeds.items()):
                ax.plot(*zip(*points, strict=True), color=f"C{i}", linestyle=styles[j % len(styles)], marker=".",
                        label=f"{method} (seed {seed})")
        ax.set(title=f"{name}: training success per step", xlabel="optimizer step", ylabel="success",
               ylim=(-0.05, 1.05))
        ax.legend(fontsize="x-small")
    for ax in list(axes.flat)[len(curves):]:
        ax.set_visible(False)
    return _save(fig, path)


# ---------------------------------------------------------------- the page

def study_markdown(study: dict[str, Any], curves_plotted: bool, curve_note: str,
                   rows: dict[str, list[dict[str, Any]]] | None = None) -> list[str]:
    """The page's Markdown lines (study.md; study.html is drawn from them); `rows`: condition_table per condition."""
    metric = study["primary"]["metric"]
    md = [f"# omrl study report: {study['study']}", "",
          f"Settings hash: {study['settings_hash']}", "", contrast_line(study), "",
          _table_md([{key: study.get(key) for key in ("seeds", "distinct_test_tasks", "test_train_overlap",
                                                      "dev_test_overlap", "test_scorings", "best_rl_on_dev",
                                                      "minutes")}],
                    ["seeds", "distinct_test_tasks", "test_train_overlap", "dev_test_overlap", "test_scorings",
                     "best_rl_on_dev", "minutes"]), "",
          f"Test {metric} success per condition and method: the seed-level mean and its 95% Student t interval "
          "over seeds, each seed's score, the paired two-level bootstrap difference (points, 95% interval) to sft "
          "and to more_sft, the seeds won against more_sft, and each seed's run's compute.", ""]
    if study.get("pending_conditions"):
        md += [f"Not run yet (the study stopped before them; resume it to add them): "
               f"{', '.join(study['pending_conditions'])}", ""]
    for name, condition in study["conditions"].items():
        md += [f"## Condition: {name}", ""]
        if condition.get("best_rl_on_dev"):
            md += [f"best_rl_on_dev: {condition['best_rl_on_dev']}", ""]
        table = rows[name] if rows is not None else condition_table(study, name)
        md += [_table_md(table, list(TABLE_COLUMNS)), ""]
        tuning = (study.get("tuning_compute") or {}).get(name) or {}
        if tuning:
            md += ["### Tuning runs (seed 0, apart from the budget)", "",
                   _table_md([{"method": m, **t} for m, t in tuning.items()], ["method", "runs", *COMPUTE]), ""]
    md += ["## Per seed", "", f"![test {metric} success per seed, mean and t interval](study_seeds.png)", "",
           "## Learning curves", "", curve_note, ""]
    if curves_plotted:
        md += ["![training success per step](study_curves.png)", ""]
    return md


def write_study_report(folder: str | Path, out: str | Path) -> dict[str, Path]:
    """Write study.md, study.html, study_seeds.png and (where per-step records are found) study_curves.png into
    `out` from the study folder `folder`; returns their paths by name."""
    folder, out = Path(folder), Path(out)
    study = read_study(folder)
    out.mkdir(parents=True, exist_ok=True)
    try:  # read_study checks the file's outline; a figure of the wrong shape deeper in is the file's fault too
        paths = {"seeds": plot_study_seeds(study, out / "study_seeds.png")}
        rows = {name: condition_table(study, name) for name in study["conditions"]}
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{folder / STUDY_FILE}: a figure is not as omrl study run writes it "
                         f"({type(exc).__name__}: {exc})") from exc
    curves = study_curves(folder, study)
    if curves:
        paths["curves"] = plot_study_curves(curves, out / "study_curves.png")
        note = ("Training success per optimizer step of each RL run's stored rollouts (the rollouts each step "
                "trained on), from the per-seed stores under conditions/ beside study.json; methods that train "
                "no rollouts (sft, more_sft, rft) have none.")
    else:
        note = ("No learning curves: study.json holds no per-step records, and no per-step training rollouts were "
                f"found in stores under {folder / 'conditions'} (the condition folders omrl study run writes).")
    md = study_markdown(study, bool(curves), note, rows)
    paths["markdown"] = out / "study.md"
    paths["markdown"].write_text("\n".join(md))
    paths["html"] = out / "study.html"
    paths["html"].write_text(_html(md, out))
    return paths
