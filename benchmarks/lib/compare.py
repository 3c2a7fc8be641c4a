"""Comparing learning methods fairly: moved to omrl.study.compare (omrl study run uses it too); re-exported here so
the benchmarks' imports keep working."""

from omrl.study.compare import (  # noqa: F401 - re-exported for benchmarks/textworld_learning.py, hard_task.py
    RL_METHODS,
    TUNABLE,
    Comparison,
    LoadMeter,
    dev_score,
    label,
    optimizer_steps,
    tokens_trained,
    train_method,
    training_curve,
    tune,
    tuned_settings,
)
