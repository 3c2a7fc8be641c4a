"""The test ledger (omrl.study.ledger): one scoring of the test set per study's settings, a second refused without
rescore, every scoring counted, crash-safe appends."""

from __future__ import annotations

import json

import pytest

from omrl.errors import UsageError
from omrl.study.ledger import LEDGER_FILE, RescoreRefused, TestLedger


def test_a_second_scoring_under_changed_settings_needs_rescore(tmp_path):
    ledger = TestLedger(tmp_path / "study")
    assert ledger.test_scorings == 0 and ledger.entries() == []
    ledger.record("aaaa", {"method": "sft", "seed": 0})
    first = ledger.record("aaaa", {"method": "grpo", "seed": 0})
    assert ledger.record("aaaa", {"method": "grpo", "seed": 0}) == first  # asked again on resume: recorded once
    assert ledger.test_scorings == 1 and len(ledger.entries()) == 2
    with pytest.raises(RescoreRefused, match=r"scored under settings aaaa \(.*\); these settings are bbbb: "
                                             r"pass --rescore \(rescore=True\) .*test_scorings becomes 2\)$") as refused:
        ledger.record("bbbb", {"method": "sft", "seed": 0})
    assert isinstance(refused.value, UsageError) and "\n" not in str(refused.value)
    assert len(ledger.entries()) == 2 and ledger.test_scorings == 1  # the refusal recorded nothing
    entry = ledger.record("bbbb", {"method": "sft", "seed": 0}, rescore=True)
    assert entry["rescore"] is True and ledger.test_scorings == 2
    assert ledger.record("bbbb", {"method": "grpo", "seed": 0})["rescore"] is False  # now these settings' scoring
    ledger.record("cccc", {"method": "sft", "seed": 1}, rescore=True)
    assert ledger.test_scorings == 3
    lines = [json.loads(line) for line in (tmp_path / "study" / LEDGER_FILE).read_text().splitlines()]
    assert [e["settings_hash"] for e in lines] == ["aaaa"] * 2 + ["bbbb"] * 2 + ["cccc"]
    assert lines[0]["what"] == {"method": "sft", "seed": 0} and lines[0]["time"].endswith("+00:00")


def test_a_line_torn_by_a_crash_is_skipped_and_the_next_starts_afresh(tmp_path):
    ledger = TestLedger(tmp_path)
    ledger.record("aaaa", {"method": "sft"})
    with open(ledger.path, "a") as f:
        f.write('{"settings_hash": "aaaa", "ti')  # a write cut short by a kill
    assert ledger.torn_lines == 1 and ledger.test_scorings == 1
    ledger.record("aaaa", {"method": "grpo"})
    assert [e["what"]["method"] for e in ledger.entries()] == ["sft", "grpo"] and ledger.torn_lines == 1
    with pytest.raises(RescoreRefused):
        ledger.record("bbbb", {})
