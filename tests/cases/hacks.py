"""The `hacks` suite of benchmarks/chaos.py: every scripted reward hack against the swe and os scorers
(tests/cases/swe_hacks.py, tests/cases/os_hacks.py) and the honest solutions beside them, in one dict."""

from __future__ import annotations

from pathlib import Path

REAL_OS_TASKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "real" / "agentbench_os_dev.json"


def run_reward_hacks(work: Path) -> dict:
    """Figures: reward_hacks_tried / reward_hacks_scored (target 0) per environment and in all, which hacks
    scored, and whether the honest fix and answers still score."""
    from omrl.envs import generate_tasks
    from tests.cases.os_hacks import run_os_hacks
    from tests.cases.swe_hacks import TINYCALC, build_sdist, run_swe_hacks

    work.mkdir(parents=True, exist_ok=True)
    task = generate_tasks("swe", n=1, packages=[build_sdist(work, TINYCALC, "0.1")])[0]
    swe = run_swe_hacks(task)
    shell = run_os_hacks(REAL_OS_TASKS)
    scored = [f"swe:{name}" for name in swe.scored] + [f"os:{name}" for name in shell["scored"]]
    return {"reward_hacks_tried": len(swe.tried) + shell["tried"], "reward_hacks_scored": len(scored),
            "reward_hacks_scored_names": scored,
            "reward_hacks_tried_per_env": {"swe": len(swe.tried), "os": shell["tried"]},
            "honest_swe_fix_resolved": swe.honest_resolved,
            "honest_swe_fix_with_test_edit_resolved": swe.honest_with_test_edit_resolved,
            "honest_os_answers_score": shell["honest_ok"]}
