"""write_report: the plots, report.md and a self-contained report.html of a store."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.report.agreement import judge_agreement, step_agreement
from omrl.report.benchmark import read_benchmark
from omrl.report.plots import (
    plot_agreement,
    plot_benchmark,
    plot_distributions,
    plot_rounds,
    plot_stages,
    plot_steps,
)
from omrl.report.rounds import round_stats
from omrl.report.run_logs import find_run_logs
from omrl.report.sections import _agreement_md, _benchmark_md, _steps_md, _table_md
from omrl.report.steps import stored_step_scores, stored_step_stats


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
    """A self-contained HTML page (images inlined) from the Markdown lines write_report writes."""
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
