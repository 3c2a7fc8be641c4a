"""`omrl report`: plots and a Markdown + HTML summary of a store (per-round curves, distributions, sizes).

    paths = write_report("runs/quickstart/store", "runs/quickstart/report", results="runs/quickstart/results.json")

Per round (collected and GRPO data; eval runs are shown separately by stage when results.json is given):
success and mean reward, reward distributions, turns and tokens per trajectory.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from omrl.schema import SUCCESS_SQL

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
        ax.legend(fontsize="small")
    return _save(fig, path)


def _table_md(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v):
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_report(store, out: str | Path, results: str | Path | None = None) -> dict[str, Path]:
    """Write PNG plots, report.md and report.html into `out`; returns their paths by name."""
    from omrl.store import Store

    store = store if isinstance(store, Store) else Store(store)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stats = round_stats(store)
    if not stats:
        raise ValueError(f"{store.path}: no trajectories to report on")
    paths = {"rounds": plot_rounds(stats, out / "rounds.png"),
             "distributions": plot_distributions(store, out / "distributions.png")}
    stage_rows: list[dict[str, Any]] = []
    if results:
        stage_rows = json.loads(Path(results).read_text())
        paths["stages"] = plot_stages(stage_rows, out / "stages.png")

    md = [f"# omrl report: {store.path.name}", "", "## Rounds", "",
          _table_md(stats, ["round", "trajectories", "success_rate", "failed", "unknown_success", "mean_reward",
                           "mean_turns", "mean_tokens"]),
          "", "![success and reward per round](rounds.png)", "",
          "![reward, turns and tokens per round](distributions.png)", ""]
    if stage_rows:
        columns = [c for c in ("stage", "success", "mean_reward", "greedy_success", "greedy_mean_reward", "tasks")
                   if any(c in r for r in stage_rows)]
        md += ["## Held-out evaluation by stage", "", _table_md(stage_rows, columns), "",
               "![held-out success by stage](stages.png)", ""]
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
        rows = [r.strip("|").split("|") for r in table if not r.startswith("|---")]
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
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](")
            data = base64.b64encode((out / src.rstrip(")")).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
    flush_table()
    style = "body{font-family:sans-serif;max-width:1000px;margin:auto}td,th{padding:2px 8px;border:1px solid #ccc}"
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>" \
           + "\n".join(body) + "</body></html>"
