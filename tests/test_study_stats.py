"""A study's statistics (omrl.study.stats) against hand-computed cases: the t quantile, the seed-level mean and
interval, duplicates grouped, the two-level bootstrap and the seeds won."""

from __future__ import annotations

import pytest

from omrl.study.stats import bootstrap_difference, mean_interval, seed_score, seeds_won, summarise, t_quantile


def test_the_t_quantile_matches_the_tables():
    assert t_quantile(0.95, 1) == pytest.approx(12.706204736, abs=1e-8)
    assert t_quantile(0.95, 2) == pytest.approx(4.302652730, abs=1e-8)
    assert t_quantile(0.95, 4) == pytest.approx(2.776445105, abs=1e-8)
    assert t_quantile(0.95, 9) == pytest.approx(2.262157163, abs=1e-8)
    assert t_quantile(0.90, 1) == pytest.approx(6.313751515, abs=1e-8)
    assert t_quantile(0.95, 100000) == pytest.approx(1.959963985, abs=1e-4)  # the normal's 1.96 in the limit
    with pytest.raises(ValueError):
        t_quantile(0.95, 0)


def test_the_t_quantile_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 7, 30, 250):
        for level in (0.5, 0.8, 0.95, 0.99):
            assert t_quantile(level, df) == pytest.approx(stats.t.ppf(0.5 + level / 2, df), rel=1e-9)


def test_the_seed_level_mean_and_t_interval():
    two = mean_interval([0.6, 0.8])  # sd 0.1414, standard error 0.1
    assert two["mean"] == pytest.approx(0.7) and two["half_width"] == pytest.approx(1.2706204736, abs=1e-8)
    three = mean_interval([0.5, 0.7, 0.9])  # sd 0.2
    assert three["half_width"] == pytest.approx(4.302652730 * 0.2 / 3 ** 0.5, abs=1e-8)
    assert mean_interval([0.4]) == {"mean": 0.4, "half_width": None, "n": 1}
    results = {1: {"a": 1.0, "b": 0.0}, 0: {"a": 1.0, "b": 1.0}, 2: {"a": 0.5, "b": 0.5}}
    figure = summarise(results)
    assert figure["per_seed"] == {0: 1.0, 1: 0.5, 2: 0.5} and figure["seeds"] == 3
    assert figure["mean"] == pytest.approx(2 / 3)
    assert figure["half_width"] == pytest.approx(4.302652730 * (1 / 12) ** 0.5 / 3 ** 0.5, abs=1e-8)  # sd^2 = 1/12


def test_duplicate_tasks_count_once():
    tasks = {"t1": 1.0, "t2": 0.0, "t3": 1.0}
    assert seed_score(tasks) == pytest.approx(2 / 3)
    assert seed_score(tasks, {"t1": "F", "t2": "F", "t3": "G"}) == pytest.approx(0.75)  # (0.5 + 1) / 2
    assert seed_score(tasks, {"t1": "F", "t3": "F"}) == pytest.approx(0.5)  # t2 its own task: (1 + 0) / 2


def test_the_bootstrap_resamples_seeds_then_tasks():
    # seed 0: a beats b by 0.1 on every task, seed 1 by 0.3: a resample of two seeds means 0.1, 0.2 or 0.3
    # (probabilities 1/4, 1/2, 1/4), so the 95% interval is [0.1, 0.3] around 0.2
    a = {0: {"x": 0.6, "y": 0.4}, 1: {"x": 0.8, "y": 0.3}}
    b = {0: {"x": 0.5, "y": 0.3}, 1: {"x": 0.5, "y": 0.0}}
    out = bootstrap_difference(a, b, draws=2000, seed=3)
    assert out["difference"] == pytest.approx(0.2) and out["ci"] == pytest.approx([0.1, 0.3])
    assert out["seeds"] == 2 and bootstrap_difference(a, b, draws=2000, seed=3) == out  # deterministic
    # one seed, task differences 0 and 1: a resample of two tasks means 0, 0.5 or 1
    one = bootstrap_difference({0: {"x": 1.0, "y": 0.0}}, {0: {"x": 0.0, "y": 0.0}}, draws=2000, seed=0)
    assert one["difference"] == pytest.approx(0.5) and one["ci"] == pytest.approx([0.0, 1.0])


def test_the_bootstrap_groups_duplicates_and_pairs_seeds():
    a = {0: {"t1": 1.0, "t2": 1.0, "t3": 0.0}, 7: {"t1": 1.0, "t2": 1.0, "t3": 0.0}}
    b = {0: {"t1": 0.0, "t2": 0.0, "t3": 0.0}, 7: {"t1": 0.0, "t2": 0.0, "t3": 0.0}, 8: {"t1": 1.0}}
    assert bootstrap_difference(a, b)["difference"] == pytest.approx(2 / 3)
    grouped = bootstrap_difference(a, b, {"t1": "F", "t2": "F"})
    assert grouped["difference"] == pytest.approx(0.5) and grouped["seeds"] == 2  # seed 8: b's only
    with pytest.raises(ValueError, match="share no seed"):
        bootstrap_difference({0: {"t": 1.0}}, {1: {"t": 1.0}})


def test_seeds_won():
    a = {0: {"t": 0.5}, 1: {"t": 0.7}, 2: {"t": 0.6}, 3: {"t": 0.9}}
    b = {0: {"t": 0.6}, 1: {"t": 0.5}, 2: {"t": 0.6}, 3: {"t": 0.1}}
    assert seeds_won(a, b) == {"wins": 2, "ties": 1, "losses": 1, "seeds": 4}
