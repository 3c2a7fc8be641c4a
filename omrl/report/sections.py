"""The report's Markdown sections (steps, agreement, benchmark) and the table they are written with."""

from __future__ import annotations

from typing import Any

from omrl.report.agreement import AGREEMENT_RULE, STEP_SERIES
from omrl.report.benchmark import BENCHMARK_COLUMNS, benchmark_rows
from omrl.report.run_logs import RunLog
from omrl.report.steps import _by_run

STEP_TABLE_ROWS = 60  # more steps than this: the Markdown lists the flagged steps and each series' last


def _table_md(table_rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v):
        text = "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ")  # a name may hold either

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in table_rows]
    return "\n".join(lines)


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


def _agreement_md(agreements: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[str]:
    md = ["## Judge vs environment", "",
          "Per score annotator and round, on trajectories with both an ok judge score (the newest per "
          f"annotator) and an environment reward; {AGREEMENT_RULE}.",
          "", _table_md(agreements, ["annotator", "round", "n", "pearson", "spearman", "mean_score",
                                     "mean_reward", "flag"]),
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
