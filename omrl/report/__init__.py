"""`omrl report`: plots and a Markdown + HTML summary of a store (per-round curves, distributions, sizes).

    paths = write_report("runs/quickstart/store", "runs/quickstart/report", results="runs/quickstart/results.json")

Per round (collected and GRPO data; eval runs are shown separately by stage when results.json is given):
success and mean reward, reward distributions, turns and tokens per trajectory. With a learning benchmark's
benchmark.json (`benchmark=`): its table of methods and their training success per step, per seed.

The package's public names; the data each section reads is in rounds, run_logs, steps, agreement and
benchmark, its figures in plots, its Markdown in sections, and write_report in writer; a study folder's page
(study.json from `omrl study run`) is write_study_report in study.
"""

from omrl.report.agreement import (
    AGREEMENT_LOW,
    AGREEMENT_RULE,
    AGREEMENT_SQL,
    STEP_AGREEMENT_SQL,
    flag_agreement,
    flag_step_agreement,
    judge_agreement,
    step_agreement,
)
from omrl.report.benchmark import benchmark_rows, read_benchmark
from omrl.report.rounds import round_stats
from omrl.report.run_logs import RUN_LOGS, STEP_KEYS, RunLog, find_run_logs, read_run_log
from omrl.report.sections import STEP_TABLE_ROWS
from omrl.report.steps import STEPS_SQL, stored_step_scores, stored_step_stats
from omrl.report.study import is_study_folder, read_study, write_study_report
from omrl.report.writer import write_report

__all__ = [
    "AGREEMENT_LOW", "AGREEMENT_RULE", "AGREEMENT_SQL", "RUN_LOGS", "STEPS_SQL", "STEP_AGREEMENT_SQL", "STEP_KEYS",
    "STEP_TABLE_ROWS", "RunLog", "benchmark_rows", "find_run_logs", "flag_agreement", "flag_step_agreement",
    "is_study_folder", "judge_agreement", "read_benchmark", "read_run_log", "read_study", "round_stats",
    "step_agreement", "stored_step_scores", "stored_step_stats", "write_report", "write_study_report",
]
