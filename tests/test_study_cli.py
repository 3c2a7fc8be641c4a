"""`omrl study check` on a tiny study: the report line, the refusal of a duplicated test task, the drop."""

from __future__ import annotations

import json

from click.testing import CliRunner

from omrl.cli.main import cli
from tests.study_helpers import tiny_study


def test_study_check_prints_the_overlap_report_and_the_settings_hash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path.parent)  # task paths are read beside the study file, not in the working folder
    study = tiny_study(tmp_path, copied=False)
    result = CliRunner().invoke(cli, ["study", "check", str(study)])
    assert result.exit_code == 0, result.output
    [line] = result.output.splitlines()
    report = json.loads(line)
    assert report["study"] == "tiny" and len(report["settings_hash"]) == 16
    assert (report["train_tasks"], report["dev_tasks"], report["distinct_test_tasks"], report["test_train_overlap"],
            report["dev_test_overlap"]) == (8, 2, 2, 0, 0)
    again = json.loads(CliRunner().invoke(cli, ["study", "check", str(study), "seeds=3"]).output)
    assert again["settings_hash"] != report["settings_hash"]


def test_study_check_refuses_a_duplicated_test_task_unless_dropping(tmp_path):
    study = tiny_study(tmp_path, copied=True)
    refused = CliRunner().invoke(cli, ["study", "check", str(study)])
    assert refused.exit_code == 1
    report = json.loads(refused.output.splitlines()[0])
    assert report["refused"] is True and report["test_train_overlap"] == 1 and report["test_tasks"] == 3
    assert "Error: held-out tasks the agent has seen: test_train_overlap 1" in refused.output
    assert "test task 'test-copy'" in refused.output and "drop_overlaps" in refused.output
    dropped = CliRunner().invoke(cli, ["study", "check", str(study), "drop_overlaps=true"])
    assert dropped.exit_code == 0, dropped.output
    report = json.loads(dropped.output)
    assert (report["test_tasks"], report["test_train_overlap"], report["dropped_test_tasks"]) == (2, 0, 1)


def test_the_shipped_example_study_checks_clean():
    result = CliRunner().invoke(cli, ["study", "check", "shipped:studies/grid"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["distinct_test_tasks"], report["distinct_dev_tasks"], report["test_train_overlap"],
            report["dev_train_overlap"], report["dev_test_overlap"]) == (100, 100, 0, 0, 0)


def test_study_check_checks_the_environment_options(tmp_path):
    study = tiny_study(tmp_path, copied=False)
    result = CliRunner().invoke(cli, ["study", "check", str(study), "env_options.noise=lots"])
    assert result.exit_code == 1
    assert "study env_options (environment 'grid'): noise must be float" in result.output
