"""SIGKILL loops over the seven commands that write stores: nothing lost, nothing doubled, nothing half-made;
and damaged store files: each one named by `omrl store check`.

CI-sized: two kills per command at random moments of its write phase, a few bit flips (benchmarks/chaos.py
runs the larger version).
"""

from __future__ import annotations

import pytest

from tests.cases.chaos import (
    annotate_scenario,
    append_scenario,
    collect_scenario,
    compact_scenario,
    filter_scenario,
    import_scenario,
    iterate_scenario,
    run_scenario,
)
from tests.cases.damage import run_damage_cases

pytestmark = pytest.mark.slow  # kill loops and damaged stores through the CLI

SMALL = {
    "collect": lambda: collect_scenario(tasks=300, samples=2),
    "append": lambda: append_scenario(rows=1500),
    "import": lambda: import_scenario(records=2000),
    "filter": lambda: filter_scenario(rows=2000),
    "compact": lambda: compact_scenario(rows=2000, parts=30),
    "annotate": lambda: annotate_scenario(rows=2000),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_killed_commands_lose_and_double_nothing(name, tmp_path):
    result = run_scenario(SMALL[name](), tmp_path, kills=2, seed=7)
    assert result.kills >= 1, result.to_dict()  # at least one kill landed while the command was working
    assert result.kills_in_write_phase == result.kills, result.to_dict()  # none before its first write
    assert result.errors == [], result.errors  # first: an error says which check failed (a partial store's why)
    assert (result.lost, result.duplicated, result.partial) == (0, 0, 0), result.to_dict()
    assert result.expected > 0


def test_a_killed_iterate_run_resumes_without_losing_or_doubling(tmp_path):
    pytest.importorskip("trl")
    result = run_scenario(iterate_scenario(), tmp_path, kills=1, seed=3)
    assert result.kills == 1, result.to_dict()
    assert result.errors == [], result.errors
    assert (result.lost, result.duplicated, result.partial) == (0, 0, 0), result.to_dict()


def test_every_damaged_store_file_is_named_by_check(tmp_path):
    report = run_damage_cases(tmp_path, flips=2, seed=11)
    assert report.cases >= 14 and report.hidden_losses == 0, report.details
