"""The report's PNG plots: one function per figure, drawn with matplotlib's file-only backend."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omrl.report.agreement import AGREEMENT_LOW, SCATTER_SQL
from omrl.report.run_logs import STEP_KEYS, RunLog
from omrl.report.steps import _by_run


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def plot_rounds(stats: list[dict[str, Any]], path: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    rounds = [s["round"] for s in stats]
    axes[0].plot(rounds, [s["success_rate"] if s["success_rate"] is not None else float("nan") for s in stats],
                 marker="o")
    axes[0].set(title="success rate per round", xlabel="round", ylabel="success", ylim=(0, 1.05))
    axes[1].plot(rounds, [s["mean_reward"] for s in stats], marker="o", color="tab:orange")
    axes[1].set(title="mean reward per round", xlabel="round", ylabel="reward")
    return _save(fig, path)


def plot_stages(results: list[dict[str, Any]], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    stages = [r["stage"] for r in results]
    series = [(label, [r.get(key) for r in results]) for key, label in
              (("success", "sampled"), ("greedy_success", "greedy"))]
    series = [(label, values) for label, values in series if any(v is not None for v in values)]
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):  # bars: stages are categories, not points on a line
        positions = [x + (i - (len(series) - 1) / 2) * width for x in range(len(stages))]
        ax.bar(positions, [v if v is not None else 0.0 for v in values], width=width, label=label)
    ax.set_xticks(range(len(stages)), stages)
    ax.set(title="held-out success by stage", ylabel="success", ylim=(0, 1.05))
    ax.legend()
    return _save(fig, path)


def plot_distributions(store, path: Path) -> Path:
    # Tokens are unknown (null, not 0) for policies that report none, e.g. scripted experts.
    rows = store.sql("SELECT round, reward, num_turns, CASE WHEN prompt_tokens IS NULL AND completion_tokens IS NULL "
                     "THEN NULL ELSE coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0) END AS tokens "
                     "FROM trajectories WHERE coalesce(source, '') <> 'eval'").to_pylist()
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for r in sorted({row["round"] for row in rows}):
        sel = [row for row in rows if row["round"] == r]
        for ax, key in zip(axes, ("reward", "num_turns", "tokens"), strict=True):
            values = [row[key] for row in sel if row[key] is not None]
            if values:
                ax.hist(values, bins=20, alpha=0.5, label=f"round {r}")
    for ax, title in zip(axes, ("reward", "turns per trajectory", "tokens per trajectory"), strict=True):
        ax.set(title=title)
        if ax.get_legend_handles_labels()[0]:  # a panel with no values (tokens unknown) has no legend
            ax.legend(fontsize="small")
    return _save(fig, path)


def plot_steps(logs: list[RunLog], stored: list[dict[str, Any]], path: Path,
               scores: list[dict[str, Any]] = (), agreement: list[dict[str, Any]] = ()) -> Path:
    """One panel per series any run logged; a line per run log, dashed lines for the stored rollouts, a
    panel of their mean judge score per annotator (`scores`, from STEP_SCORES_SQL) and one of the judge's
    Pearson r with the environment's reward (`agreement`, step_agreement's rows; flagged steps marked)."""
    names = [n for n in STEP_KEYS if any(n in s for log in logs for s in log.steps)]
    for extra in ("reward", "success"):
        if stored and extra not in names:
            names.append(extra)
    names.sort(key=list(STEP_KEYS).index)
    if scores:
        names.append("judge score")
    if any(row["pearson"] is not None for row in agreement):
        names.append("judge vs env r")
    plt = _plt()
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for log in logs:
            points = [(s["step"], s[name]) for s in log.steps if name in s]
            if points:
                ax.plot(*zip(*points, strict=True), marker=".", label=f"{log.label} ({log.kind} log)")
        if name == "judge score":
            lines: dict[str, list[tuple[int, float]]] = {}
            for row in scores:
                lines.setdefault(f"{row['annotator']}: {row['run']} r{row['round']}", []).append(
                    (row["step"], row["mean_score"]))
            for label, points in lines.items():
                ax.plot(*zip(*points, strict=True), linestyle="--", label=label)
        if name == "judge vs env r":
            series: dict[str, list[dict[str, Any]]] = {}
            for row in agreement:
                if row["pearson"] is not None:
                    series.setdefault(f"{row['annotator']}: {row['run']} r{row['round']}", []).append(row)
            for label, rows_ in series.items():
                line, = ax.plot([r["step"] for r in rows_], [r["pearson"] for r in rows_], linestyle="--",
                                marker=".", label=label)
                flagged = [r for r in rows_ if r["flag"]]
                if flagged:
                    ax.scatter([r["step"] for r in flagged], [r["pearson"] for r in flagged], marker="x", s=40,
                               color=line.get_color(), zorder=3)
            ax.axhline(AGREEMENT_LOW, color="grey", linewidth=0.8, linestyle=":")
            ax.set_ylim(-1.05, 1.05)
        if name in ("reward", "success"):
            key = "mean_reward" if name == "reward" else "success_rate"
            for (run, number), rows_ in _by_run(stored).items():
                points = [(r["step"], r[key]) for r in rows_ if r[key] is not None]
                if points:
                    ax.plot(*zip(*points, strict=True), linestyle="--", label=f"{run} r{number} (store)")
        ax.set(title=name.replace("_", " "), xlabel="step")
        if name == "success":
            ax.set_ylim(-0.05, 1.05)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    return _save(fig, path)


def plot_agreement(store, annotators: list[str], path: Path) -> Path:
    """Judge score against environment reward, one panel per annotator, one colour per round."""
    points = store.sql(SCATTER_SQL).to_pylist()
    plt = _plt()
    cols = min(3, len(annotators))
    rows = math.ceil(len(annotators) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, annotator in zip(axes.flat, annotators, strict=False):
        mine = [p for p in points if p["annotator"] == annotator]
        for number in sorted({p["round"] for p in mine}, key=lambda x: (x is None, x)):
            sel = [p for p in mine if p["round"] == number]
            ax.scatter([p["reward"] for p in sel], [p["score"] for p in sel], s=12, alpha=0.45,
                       label=f"round {number}")
        ax.set(title=annotator, xlabel="environment reward", ylabel="judge score")
        ax.legend(fontsize="x-small")
    for ax in list(axes.flat)[len(annotators):]:
        ax.set_visible(False)
    return _save(fig, path)


def plot_benchmark(curves: dict[str, list[list[list[float]]]], path: Path, seeds: list[Any] | None = None) -> Path:
    """Training success per step: a colour per method, a line style per seed (`seeds`: their names, in order)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    styles = ("-", "--", ":", "-.")
    for i, (method, runs) in enumerate(curves.items()):
        colour = f"C{i}"
        for i_seed, points in enumerate(runs):
            seed = seeds[i_seed] if seeds and i_seed < len(seeds) else i_seed
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, linestyle=styles[i_seed % len(styles)], marker=".",
                        label=f"{method} (seed {seed})")
    ax.set(title="training success per step (the step's rollouts)", xlabel="step", ylabel="success",
           ylim=(-0.05, 1.05))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small", ncol=2)
    return _save(fig, path)
