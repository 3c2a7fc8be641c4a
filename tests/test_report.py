"""`omrl report` writes real plots and a summary listing every round."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from click.testing import CliRunner  # noqa: E402

from omrl.schema import Message, Trajectory  # noqa: E402
from omrl.store import Store  # noqa: E402


def test_report_files_have_content(tmp_path):
    store = Store.create(tmp_path / "s")
    rows = []
    for r in range(3):
        for i in range(6):
            ok = i < 2 + r
            rows.append(Trajectory(id=f"r{r}-{i}", task_id=f"t{i}", round=r, group_id=f"g{r}-{i // 3}",
                                   messages=[Message("user", "go"), Message("assistant", "up")],
                                   reward=1.0 if ok else 0.0, success=ok, num_turns=1 + i % 3,
                                   prompt_tokens=10 * i, completion_tokens=5).to_row())
    rows.append(Trajectory(id="e", task_id="t0", source="eval", messages=[Message("user", "go")], reward=5.0,
                           success=True).to_row())
    store.append(rows)
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"stage": "base", "success": 0.0, "mean_reward": 0.0, "tasks": 6},
                                   {"stage": "sft", "success": 0.3, "mean_reward": 0.4, "tasks": 6},
                                   {"stage": "grpo-1", "success": 0.5, "mean_reward": 0.6, "tasks": 6}]))
    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["report", str(store.path), "--out", str(tmp_path / "rep"),
                                      "--results", str(results)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "rep"
    for name in ("rounds.png", "distributions.png", "stages.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    md = (out / "report.md").read_text()
    # one row per collected round with its success rate (eval rows excluded), and every stage
    assert "| 0 | 6 | 0.333 |" in md and "| 1 | 6 | 0.500 |" in md and "| 2 | 6 | 0.667 |" in md
    assert "| grpo-1 | 0.500 |" in md
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<td>grpo-1</td>" in page


def test_report_on_empty_store_is_a_clean_error(tmp_path):
    from omrl.cli.main import cli

    Store.create(tmp_path / "s")
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "s"), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and "no trajectories" in result.output


def test_report_counts_failed_and_unknown_beside_the_rate(tmp_path):
    """Failed episodes and unknown success are shown beside the rate, never counted as failures."""
    from omrl.report import write_report

    store = Store.create(tmp_path / "s")
    outcomes = [("ok", True)] * 4 + [("policy_error", None)] * 3 + [("ok", None)]
    store.append([Trajectory(id=f"t{i}", task_id="t", messages=[Message("user", "go")], status=status,
                             success=success).to_row() for i, (status, success) in enumerate(outcomes)])
    md = write_report(store, tmp_path / "rep")["markdown"].read_text()
    assert "| round | trajectories | success_rate | failed | unknown_success |" in md
    assert "| 0 | 8 | 1.000 | 3 | 1 |" in md
