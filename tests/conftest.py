"""Shared fixtures: stores with known contents and the location of the real public data files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omrl.schema import Message, ToolCall, Trajectory, Turn
from omrl.store import Store

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REAL_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


@pytest.fixture(autouse=True)
def _forget_endpoints():
    """Each test's fake servers start fresh: a port reused by another test's server is not that server."""
    from omrl.llm.endpoint import forget

    forget()


@pytest.fixture
def real_data() -> Path:
    """The folder of real public data files; tests using it skip when it is absent."""
    if not REAL_DATA.is_dir():
        pytest.skip(f"real data folder {REAL_DATA} not present")
    return REAL_DATA


def make_trajectory(index: int, *, task_id: str | None = None, reward: float = 1.0, success: bool = True,
                    env: str = "math", run_id: str = "run-a", round: int = 0, sample: int = 0,
                    status: str = "ok") -> Trajectory:
    """A small hand-made trajectory with one tool call and a final answer."""
    task_id = task_id or f"task-{index}"
    return Trajectory(
        id=f"traj-{index}",
        task_id=task_id,
        run_id=run_id,
        round=round,
        sample=sample,
        env=env,
        model="test-model",
        instruction=f"What is {index} + 1?",
        task=f'{{"answer": "{index + 1}"}}',
        messages=[
            Message("system", "You are a calculator agent."),
            Message("user", f"What is {index} + 1?"),
            Message("assistant", "Let me compute.", tool_calls=[ToolCall("calculator", f'{{"expression": "{index}+1"}}', "c1")]),
            Message("tool", str(index + 1), tool_call_id="c1", name="calculator"),
            Message("assistant", None, tool_calls=[ToolCall("answer", f'{{"value": "{index + 1}"}}', "c2")]),
            Message("tool", "correct" if success else "wrong", tool_call_id="c2", name="answer"),
        ],
        turns=[Turn(0, 0.0, latency_s=0.1, prompt_tokens=20, completion_tokens=8),
               Turn(1, reward, True, latency_s=0.1, prompt_tokens=30, completion_tokens=6)],
        reward=reward,
        success=success,
        status=status,
        prompt_tokens=50,
        completion_tokens=14,
        duration_s=0.3,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A store with 6 trajectories: tasks task-0..2, two samples each, the second sample failing."""
    s = Store.create(tmp_path / "store")
    rows = []
    for i in range(3):
        for sample in range(2):
            t = make_trajectory(i * 2 + sample, task_id=f"task-{i}", sample=sample,
                                reward=1.0 if sample == 0 else 0.0, success=sample == 0)
            rows.append(t.to_row())
    s.append(rows)
    return s
