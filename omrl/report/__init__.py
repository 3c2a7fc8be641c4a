"""`omrl report`: plots and a Markdown + HTML summary of a store (per-round curves, distributions, sizes).

    paths = write_report("runs/quickstart/store", "runs/quickstart/report", results="runs/quickstart/results.json")

Per round (collected and GRPO data; eval runs are shown separately by stage when results.json is given):
success and mean reward, reward distributions, turns and tokens per trajectory. With a learning benchmark's
benchmark.json (`benchmark=`): its table of methods and their training success per step, per seed.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.schema import SUCCESS_SQL
from omrl.store.readers import json_kind

# Success rate: solved / episodes with a known outcome (omrl.schema); failed and unknown counted beside it.
ROUND_SQL = f"""
SELECT round, count(*) AS trajectories, {SUCCESS_SQL},
       avg(reward) AS mean_reward, avg(num_turns) AS mean_turns,
       avg(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0))
           FILTER (WHERE prompt_tokens IS NOT NULL OR completion_tokens IS NOT NULL) AS mean_tokens
FROM trajectories WHERE coalesce(source, '') <> 'eval'
GROUP BY round ORDER BY round
"""


def round_stats(store) -> list[dict[str, Any]]:
    """Per-round counts, success rate (with failed and unknown-success counts), mean reward, turns, tokens.

    Eval runs are excluded."""
    return store.sql(ROUND_SQL).to_pylist()


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


def _table_md(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v):
        text = "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ")  # a name may hold either

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ training curves per step

RUN_LOGS = {"omrl_grpo.json": "grpo", "omrl_ppo.json": "ppo"}
# Our series name -> the log keys that carry it (first found wins): TRL's GRPO log names and omrl PPO's.
STEP_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward",),
    "success": ("success",),  # PPO logs it; GRPO's comes from the stored rollouts (STEPS_SQL)
    "loss": ("loss", "policy_loss"),
    "entropy": ("entropy",),
    "value_loss": ("value_loss",),
    "explained_variance": ("explained_variance",),
    "clip_fraction": ("clip_fraction", "clip_ratio/region_mean"),
    "approx_kl": ("approx_kl",),
    "kl": ("kl", "kl_ref"),
}


@dataclass
class RunLog:
    """One trainer's per-step log: `steps` holds {"step", and each STEP_KEYS series it logged}."""

    kind: str  # grpo or ppo
    path: Path
    label: str  # the log's folder, relative to the --runs folder it was found under
    round: int | None
    steps: list[dict[str, Any]]


def _finite(value: Any) -> float | None:
    # PPO writes NaN for what a step could not measure (kl_ref without a reference): no value, not 0.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def read_run_log(path: str | Path, label: str | None = None) -> RunLog:
    """A run log written by train_grpo (omrl_grpo.json) or train_ppo (omrl_ppo.json), as RunLog."""
    path = Path(path)
    kind = RUN_LOGS.get(path.name)
    if kind is None:
        raise UsageError(f"{path}: not a run log (expected one of {', '.join(RUN_LOGS)})")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable run log ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("log"), list):
        raise UsageError(f"{path}: a run log is a JSON object with a 'log' list, got {json_kind(data)}")
    steps = []
    for entry in data["log"]:
        # TRL's closing summary entry (train_runtime, ...) has no step metrics: not a step
        if not isinstance(entry, dict) or _finite(entry.get("step")) is None:
            continue
        row: dict[str, Any] = {"step": int(entry["step"])}
        for name, keys in STEP_KEYS.items():
            value = next((_finite(entry[k]) for k in keys if k in entry), None)
            if value is not None:
                row[name] = value
        if len(row) > 1:
            steps.append(row)
    recipe = data.get("recipe") if isinstance(data.get("recipe"), dict) else {}
    number = recipe.get("round")
    return RunLog(kind, path, label or str(path.parent), number if isinstance(number, int) else None,
                  sorted(steps, key=lambda r: r["step"]))


def find_run_logs(folders: list[str | Path]) -> list[RunLog]:
    """Every omrl_grpo.json / omrl_ppo.json under these folders (a file may be given as is), in path order."""
    logs = []
    for folder in folders:
        folder = Path(folder)
        if folder.is_file():
            logs.append(read_run_log(folder, folder.parent.name))
            continue
        if not folder.is_dir():
            raise UsageError(f"--runs {folder}: no such folder")
        found = sorted(p for name in RUN_LOGS for p in folder.rglob(name))
        if not found:
            raise UsageError(f"--runs {folder}: no {' or '.join(RUN_LOGS)} under it (written by omrl train "
                             "grpo, ppo and iterate into their output folders)")
        for path in found:
            label = str(path.parent.relative_to(folder)) if path.parent != folder else folder.name
            logs.append(read_run_log(path, label))
    return logs


# Per step from the stored rollouts: GRPO and PPO tag each rollout's metadata with its step. A GRPO rollout
# played at TRL global step k is trained on in update k + 1, the step its log entry carries: shifted to match.
# The run is the run_id without its /step-N tail (an attempt-N of a re-run stays apart).
_TAGGED_SQL = """
SELECT id, regexp_replace(run_id, '/step-[0-9]+$', '') AS run, round, reward, success, status,
       CASE WHEN grpo_step IS NOT NULL THEN 'grpo' ELSE 'ppo' END AS kind, coalesce(grpo_step + 1, ppo_step) AS step
FROM (
    SELECT *,
           CASE WHEN json_valid(metadata) THEN TRY_CAST(json_extract_string(metadata, '$.grpo_step') AS INTEGER)
           END AS grpo_step,
           CASE WHEN json_valid(metadata) THEN TRY_CAST(json_extract_string(metadata, '$.ppo_step') AS INTEGER)
           END AS ppo_step
    FROM trajectories WHERE contains(metadata, '_step')  -- cheap pre-filter
)
WHERE grpo_step IS NOT NULL OR ppo_step IS NOT NULL
"""
STEPS_SQL = f"""
SELECT run, round, kind, step, count(*) AS episodes, avg(reward) AS mean_reward, {SUCCESS_SQL}
FROM ({_TAGGED_SQL}) GROUP BY run, round, kind, step ORDER BY run, round, step
"""
# The mean judge score per step of those rollouts (newest ok score per trajectory and annotator).
STEP_SCORES_SQL = f"""
SELECT t.run, t.round, a.annotator, t.step, count(*) AS n, avg(a.score) AS mean_score
FROM ({_TAGGED_SQL}) t JOIN latest_annotations a ON a.trajectory_id = t.id
WHERE a.kind = 'score' AND a.status = 'ok' AND isfinite(a.score)
GROUP BY t.run, t.round, a.annotator, t.step ORDER BY t.run, t.round, a.annotator, t.step
"""


def stored_step_stats(store) -> list[dict[str, Any]]:
    """Episodes, mean reward and success rate per (run, round, step) of the GRPO/PPO rollouts in the store."""
    return store.sql(STEPS_SQL).to_pylist()


def stored_step_scores(store) -> list[dict[str, Any]]:
    """Mean score per (run, round, annotator, step) of the annotations on the stored GRPO/PPO rollouts."""
    return store.sql(STEP_SCORES_SQL).to_pylist()


def _by_run(stats: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in stats:
        runs.setdefault((row["run"], row["round"]), []).append(row)
    return runs


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


def _steps_md(logs: list[RunLog], stored: list[dict[str, Any]]) -> list[str]:
    summary = []
    for log in logs:
        first, last = (log.steps[0], log.steps[-1]) if log.steps else ({}, {})
        summary.append({"run": log.label, "kind": log.kind, "round": log.round, "steps": len(log.steps),
                        "last_step": last.get("step"), "first_reward": first.get("reward"),
                        "last_reward": last.get("reward"), "last_success": last.get("success"),
                        "last_loss": last.get("loss"), "last_entropy": last.get("entropy")})
    md = ["## Training steps", "",
          "Per optimizer step from the trainers' logs (`omrl_grpo.json`: TRL's log; `omrl_ppo.json`), and "
          "from the rollouts stored per step (dashed: episodes, reward, success and mean judge score of what each "
          "step trained on).",
          ""]
    if summary:
        md += [_table_md(summary, ["run", "kind", "round", "steps", "last_step", "first_reward", "last_reward",
                                   "last_success", "last_loss", "last_entropy"]), ""]
    if stored:
        rows = []
        for (run, number), steps in _by_run(stored).items():
            rows.append({"run": run, "round": number, "kind": steps[0]["kind"], "steps": len(steps),
                         "episodes": sum(s["episodes"] for s in steps),
                         "first_success": steps[0]["success_rate"], "last_success": steps[-1]["success_rate"],
                         "first_reward": steps[0]["mean_reward"], "last_reward": steps[-1]["mean_reward"]})
        md += [_table_md(rows, ["run", "round", "kind", "steps", "episodes", "first_success", "last_success",
                                "first_reward", "last_reward"]), ""]
    md += ["![training curves per step](steps.png)", ""]
    return md


# ------------------------------------------------------------------ judge vs environment agreement

# A round is flagged when its agreement is weak or has fallen: at least AGREEMENT_MIN_N pairs and a Pearson
# correlation below AGREEMENT_LOW, or AGREEMENT_DROP below the same annotator's previous round with a value.
# A judge whose scores stop following the environment's reward is the first sign of reward hacking.
AGREEMENT_MIN_N = 5
AGREEMENT_LOW = 0.3
AGREEMENT_DROP = 0.2
AGREEMENT_RULE = (f"flagged: n >= {AGREEMENT_MIN_N} and Pearson r < {AGREEMENT_LOW}, or r at least {AGREEMENT_DROP} "
                  "below the annotator's previous round (per step: the previous step of the same run and round): "
                  "the judge stops following the environment (a sign of reward hacking)")
STEP_TABLE_ROWS = 60  # more steps than this: the Markdown lists the flagged steps and each series' last
SCATTER_POINTS = 400  # per annotator and round, a deterministic sample (by id hash) for the plot

# Pairs: the newest ok score of each annotator (latest_annotations) beside the trajectory's environment
# reward. Spearman is Pearson over average ranks (ties share their mean rank).
_PAIRS_SQL = """
SELECT a.annotator, t.round, a.trajectory_id, a.score, t.reward
FROM latest_annotations a JOIN trajectories t ON t.id = a.trajectory_id
WHERE a.kind = 'score' AND a.status = 'ok' AND isfinite(a.score) AND isfinite(t.reward)
"""
# The same pairs on the GRPO/PPO rollouts stored per step, keyed by their run, round, kind and step.
_STEP_PAIRS_SQL = f"""
SELECT a.annotator, t.run, t.round, t.kind, t.step, a.trajectory_id, a.score, t.reward
FROM ({_TAGGED_SQL}) t JOIN latest_annotations a ON a.trajectory_id = t.id
WHERE a.kind = 'score' AND a.status = 'ok' AND isfinite(a.score) AND isfinite(t.reward)
"""


def _agreement_sql(pairs: str, keys: list[str]) -> str:
    """Per annotator and `keys` of `pairs` (annotator, keys, trajectory_id, score, reward): n, Pearson,
    Spearman, mean score and reward, ordered by annotator then keys (the one agreement formula)."""
    group = ", ".join(["annotator", *keys])
    return f"""
WITH pairs AS ({pairs}),
ranked AS (
    SELECT *,
        rank() OVER (PARTITION BY {group} ORDER BY score)
            + (count(*) OVER (PARTITION BY {group}, score) - 1) / 2.0 AS score_rank,
        rank() OVER (PARTITION BY {group} ORDER BY reward)
            + (count(*) OVER (PARTITION BY {group}, reward) - 1) / 2.0 AS reward_rank
    FROM pairs
)
SELECT {group}, count(*) AS n, corr(score, reward) AS pearson, corr(score_rank, reward_rank) AS spearman,
       avg(score) AS mean_score, avg(reward) AS mean_reward
FROM ranked GROUP BY {group} ORDER BY {group}
"""


AGREEMENT_SQL = _agreement_sql(_PAIRS_SQL, ["round"])
# Per step within a run's round: a series per (annotator, run, round, kind), flagged against its own
# previous step as rounds are against the previous round.
STEP_SERIES = ("run", "round", "kind")
STEP_AGREEMENT_SQL = _agreement_sql(_STEP_PAIRS_SQL, [*STEP_SERIES, "step"])
SCATTER_SQL = f"""
SELECT annotator, round, score, reward FROM ({_PAIRS_SQL})
QUALIFY row_number() OVER (PARTITION BY annotator, round ORDER BY hash(trajectory_id), trajectory_id)
        <= {SCATTER_POINTS}
ORDER BY annotator, round
"""


def _number(value: Any) -> float | None:
    # corr() of a constant column is NaN (or NULL): no correlation to speak of
    return None if value is None or not math.isfinite(value) else float(value)


def judge_agreement(store) -> list[dict[str, Any]]:
    """Per score annotator and trajectory round, where both a judge score and an environment reward exist:
    n, Pearson and Spearman correlation, mean score and reward, and `flag` (the rule above; '' if none)."""
    return flag_agreement(store.sql(AGREEMENT_SQL).to_pylist())


def step_agreement(store) -> list[dict[str, Any]]:
    """judge_agreement per training step: per annotator, run, round, kind (grpo/ppo) and step of the stored
    rollouts, flagged by the same rule against the series' previous step."""
    return flag_step_agreement(store.sql(STEP_AGREEMENT_SQL).to_pylist())


def flag_step_agreement(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """STEP_AGREEMENT_SQL's rows flagged (flag_agreement, each series against its previous step)."""
    return flag_agreement(rows, series=STEP_SERIES, unit="step")


def flag_agreement(rows: list[dict[str, Any]], series: tuple[str, ...] = (), unit: str = "round"
                   ) -> list[dict[str, Any]]:
    """Agreement rows ordered by annotator, `series` keys, then `unit` (AGREEMENT_SQL's or
    STEP_AGREEMENT_SQL's) with NaN correlations as None and `flag` set; a fall is measured against the
    previous `unit` of the same annotator and series."""
    previous: dict[tuple, float] = {}
    for row in rows:
        row["pearson"], row["spearman"] = _number(row["pearson"]), _number(row["spearman"])
        flags = []
        key = (row["annotator"], *(row[k] for k in series))
        r, before = row["pearson"], previous.get(key)
        if row["n"] >= AGREEMENT_MIN_N and r is not None:
            if r < AGREEMENT_LOW:
                flags.append(f"low (r < {AGREEMENT_LOW})")
            if before is not None and r <= before - AGREEMENT_DROP:
                flags.append(f"fell {before - r:.2f} since the previous {unit}")
        row["flag"] = "; ".join(flags)
        if r is not None and row["n"] >= AGREEMENT_MIN_N:
            previous[key] = r
    return rows


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


def _agreement_md(rows: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[str]:
    md = ["## Judge vs environment", "",
          "Per score annotator and round, on trajectories with both an ok judge score (the newest per "
          f"annotator) and an environment reward; {AGREEMENT_RULE}.",
          "", _table_md(rows, ["annotator", "round", "n", "pearson", "spearman", "mean_score", "mean_reward",
                               "flag"]),
          "", "![judge score against environment reward](agreement.png)", ""]
    if steps:
        shown, note = steps, "every step"
        if len(steps) > STEP_TABLE_ROWS:  # the flagged steps and where each series ended
            last = {(r["annotator"], *(r[k] for k in STEP_SERIES)): r for r in steps}
            shown = [r for r in steps if r["flag"] or r is last[(r["annotator"], *(r[k] for k in STEP_SERIES))]]
            note = f"the flagged steps and each series' last step ({len(shown)} of {len(steps)} rows)"
        md += ["### Per training step", "",
               "The same agreement per step of the GRPO/PPO rollouts stored by the trainers (their metadata's "
               f"step, shifted to the optimizer step that trained on them, as in Training steps): {note}; "
               "the steps plot draws r per step (x: flagged).",
               "", _table_md(shown, ["annotator", "run", "round", "kind", "step", "n", "pearson", "spearman",
                                     "mean_score", "mean_reward", "flag"]), ""]
    return md


# ------------------------------------------------------------------ a learning benchmark's methods

BENCHMARK_COLUMNS = ("method", "sampled", "greedy", "greedy per seed", "training rollouts", "wall s per seed",
                     "settings")


def read_benchmark(path: str | Path) -> dict[str, Any]:
    """A learning benchmark's result (benchmarks/textworld_learning.py's benchmark.json: `methods`, each with
    sampled and greedy success and their intervals, and optionally `curves`)."""
    path = Path(path)
    try:
        line = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a benchmark result ({exc})") from None
    if not isinstance(line, dict) or not isinstance(line.get("methods"), dict):
        raise UsageError(f"{path}: not a benchmark result (no `methods` object)")
    return line


def _percent(value: Any, ci: Any = None) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{100 * value:.1f}%" + (f" ±{100 * ci:.1f}" if isinstance(ci, (int, float)) and ci else "")


def benchmark_rows(line: dict[str, Any]) -> list[dict[str, str]]:
    """One table row per method of a benchmark result (the columns of BENCHMARK_COLUMNS)."""
    rows = []
    for method, m in line["methods"].items():
        seeds = [_percent(s.get("greedy")) for s in m.get("per_seed") or []]
        settings = m.get("hyperparameters")
        rows.append({"method": method, "sampled": _percent(m.get("sampled"), m.get("sampled_ci95")),
                     "greedy": _percent(m.get("greedy"), m.get("greedy_ci95")),
                     "greedy per seed": " / ".join(seeds) if any(s != "-" for s in seeds) else "-",
                     "training rollouts": str(m.get("training_rollouts", "-")),
                     "wall s per seed": " / ".join(f"{w:.0f}" for w in m.get("wall_s") or []) or "-",
                     "settings": json.dumps(settings, sort_keys=True) if settings else "-"})
    return rows


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


def _benchmark_md(line: dict[str, Any], plotted: bool) -> list[str]:
    md = [f"## Benchmark: {line.get('benchmark', 'methods')}", "",
          f"Held-out success (± 95% interval over {line.get('test_games', '?')} test games), mean over seeds "
          f"{line.get('seeds', '?')}; sampled: {line.get('eval', {}).get('samples', '?')} episodes per game at "
          "temperature 1, greedy: one.", "",
          _table_md(benchmark_rows(line), list(BENCHMARK_COLUMNS)), ""]
    headline = [(k, line.get(k)) for k in ("best_rl_method", "best_rl_greedy_gain_points", "best_rl_greedy_gain_ci95",
                                           "best_ppo", "ppo_vs_sft_greedy_points", "ppo_vs_sft_greedy_ci95")]
    md += [", ".join(f"{k}: {v}" for k, v in headline if v is not None), ""]
    credit = line.get("step_credit_vs_grpo_points")
    if credit:
        md += ["Step credit minus GRPO (points, paired per game): "
               + ", ".join(f"{mode} {v.get('points')} ±{v.get('ci95')}" for mode, v in credit.items()), ""]
    diagnostics = line.get("step_credit_diagnostics")
    if diagnostics:
        md += ["Step credit diagnostics: " + ", ".join(f"{k} {v}" for k, v in diagnostics.items()), ""]
    if plotted:
        md += ["![training success per step, per method and seed](benchmark.png)", ""]
    return md


def write_report(store, out: str | Path, results: str | Path | None = None,
                 runs: list[str | Path] | tuple = (), benchmark: str | Path | None = None) -> dict[str, Path]:
    """Write PNG plots, report.md and report.html into `out`; returns their paths by name.

    `runs`: folders searched for trainer logs (omrl_grpo.json, omrl_ppo.json) to plot per step.
    `benchmark`: a learning benchmark's benchmark.json: its table of methods and its per-step curves."""
    from omrl.store import Store

    store = store if isinstance(store, Store) else Store(store)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stats = round_stats(store)
    if not stats:
        raise UsageError(f"{store.path}: no trajectories to report on")
    paths = {"rounds": plot_rounds(stats, out / "rounds.png"),
             "distributions": plot_distributions(store, out / "distributions.png")}
    stage_rows: list[dict[str, Any]] = []
    if results:
        stage_rows = json.loads(Path(results).read_text())
        paths["stages"] = plot_stages(stage_rows, out / "stages.png")

    line = read_benchmark(benchmark) if benchmark else None
    md = [f"# omrl report: {store.path.name}", ""]
    if line is not None:
        curves = line.get("curves") or {}
        if any(points for series in curves.values() for points in series):
            paths["benchmark"] = plot_benchmark(curves, out / "benchmark.png", line.get("seeds"))
        md += _benchmark_md(line, "benchmark" in paths)
    md += ["## Rounds", "",
          _table_md(stats, ["round", "trajectories", "success_rate", "failed", "unknown_success", "mean_reward",
                           "mean_turns", "mean_tokens"]),
          "", "![success and reward per round](rounds.png)", "",
          "![reward, turns and tokens per round](distributions.png)", ""]
    if stage_rows:
        columns = [c for c in ("stage", "success", "mean_reward", "greedy_success", "greedy_mean_reward", "tasks")
                   if any(c in r for r in stage_rows)]
        md += ["## Held-out evaluation by stage", "", _table_md(stage_rows, columns), "",
               "![held-out success by stage](stages.png)", ""]
    logs = find_run_logs(list(runs)) if runs else []
    stored = stored_step_stats(store)
    per_step = step_agreement(store) if stored else []
    if logs or stored:
        paths["steps"] = plot_steps(logs, stored, out / "steps.png", stored_step_scores(store) if stored else [],
                                    per_step)
        md += _steps_md(logs, stored)
    agreement = judge_agreement(store)
    if agreement:
        paths["agreement"] = plot_agreement(store, sorted({r["annotator"] for r in agreement}),
                                            out / "agreement.png")
        md += _agreement_md(agreement, per_step)
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text("\n".join(md))
    paths["html"] = out / "report.html"
    paths["html"].write_text(_html(md, out))
    return paths


def _html(md_lines: list[str], out: Path) -> str:
    """A self-contained HTML page (images inlined) from the Markdown lines this module writes."""
    body = []
    table: list[str] = []

    def flush_table():
        if not table:
            return
        rows = [[c.replace("\\|", "|") for c in re.split(r"(?<!\\)\|", r[1:-1])]
                for r in table if not r.startswith("|---")]
        head, *rest = rows
        body.append("<table><tr>" + "".join(f"<th>{html.escape(c.strip())}</th>" for c in head) + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in r) + "</tr>"
                              for r in rest) + "</table>")
        table.clear()

    for line in "\n".join(md_lines).splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush_table()
        if line.startswith("### "):
            body.append(f"<h3>{html.escape(line[4:])}</h3>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](")
            data = base64.b64encode((out / src.rstrip(")")).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    flush_table()
    style = "body{font-family:sans-serif;max-width:1000px;margin:auto}td,th{padding:2px 8px;border:1px solid #ccc}"
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>" \
           + "\n".join(body) + "</body></html>"
