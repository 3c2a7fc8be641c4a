"""A study's figures at the right unit: the seed. Per-seed results in, the seed-level mean with a Student t
interval over seeds, a two-level bootstrap of a difference between methods, and the seeds one method wins.

Results are `{seed: {task_id: success}}` (a task's success already averaged over its samples), `groups` an
optional task id -> fingerprint (omrl.study.fingerprint). A seed's score is the mean over its distinct tasks:
tasks sharing a fingerprint are one task (their mean counts once), so a set holding a game twice does not weigh
it twice; with no groups every task is its own. The same score feeds the mean, the t interval, the bootstrap
and the wins, so an interval and its estimate always describe the same figure.

The project had only a normal 95% interval over tasks (omrl.train.iterate.evaluation.interval); over 2 to 10
seeds that is far too narrow, so the t quantile is computed here (scipy is a dev extra only): the regularized
incomplete beta function by its continued fraction, inverted by bisection.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

Results = Mapping[int, Mapping[str, float]]


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' betacf)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_tail(t: float, df: int) -> float:
    """P(|T| > t) for Student's t with `df` degrees of freedom."""
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(level: float, df: int) -> float:
    """The t with P(|T| <= t) = level (level 0.95: the 97.5% quantile), to 1e-10."""
    if not 0.0 < level < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0 < level < 1 and df >= 1, not level {level}, df {df}")
    alpha, low, high = 1.0 - level, 0.0, 1.0
    while t_two_sided_tail(high, df) > alpha:
        high *= 2.0
    while high - low > 1e-10 * max(1.0, high):
        middle = (low + high) / 2.0
        low, high = (middle, high) if t_two_sided_tail(middle, df) > alpha else (low, middle)
    return (low + high) / 2.0


def seed_score(tasks: Mapping[str, float], groups: Mapping[str, str] | None = None) -> float:
    """One seed's score: the mean over distinct tasks, tasks of one fingerprint averaged into one."""
    grouped = _grouped(tasks, groups)
    return sum(grouped.values()) / len(grouped)


def seed_scores(results: Results, groups: Mapping[str, str] | None = None) -> dict[int, float]:
    """seed -> its score (seed_score), in seed order."""
    return {seed: seed_score(results[seed], groups) for seed in sorted(results)}


def mean_interval(values: list[float], level: float = 0.95) -> dict[str, Any]:
    """The mean of `values` and the half-width of its Student t interval (None for fewer than two values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "half_width": None, "n": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return {"mean": mean, "half_width": t_quantile(level, n - 1) * sd / math.sqrt(n), "n": n}


def summarise(results: Results, groups: Mapping[str, str] | None = None, level: float = 0.95) -> dict[str, Any]:
    """A method's per-seed scores, their mean and the t interval over seeds: {per_seed, mean, half_width, seeds}."""
    scores = seed_scores(results, groups)
    figure = mean_interval(list(scores.values()), level)
    return {"per_seed": scores, "mean": figure["mean"], "half_width": figure["half_width"], "seeds": len(scores)}


def bootstrap_difference(a: Results, b: Results, groups: Mapping[str, str] | None = None, *, draws: int = 2000,
                         seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """a minus b, paired: seed s of a against seed s of b, the same distinct tasks. The estimate is the mean over
    the common seeds of the mean over common distinct tasks of (a - b); the interval is the percentile interval
    of `draws` two-level resamples: the seeds with replacement, then within each drawn seed its distinct tasks
    with replacement. Deterministic given `seed`."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("the two methods share no seed")
    diffs = []  # per seed: the distinct tasks' differences
    for s in seeds:
        ga, gb = _grouped(a[s], groups), _grouped(b[s], groups)
        common = sorted(set(ga) & set(gb))
        if not common:
            raise ValueError(f"seed {s}: the two methods share no task")
        diffs.append([ga[g] - gb[g] for g in common])
    estimate = sum(sum(d) / len(d) for d in diffs) / len(diffs)
    rng = random.Random(seed)
    samples = []
    for _ in range(draws):
        total = 0.0
        for _ in seeds:
            d = diffs[rng.randrange(len(diffs))]
            total += sum(d[rng.randrange(len(d))] for _ in d) / len(d)
        samples.append(total / len(seeds))
    samples.sort()
    tail = (1.0 - level) / 2.0
    return {"difference": estimate, "ci": [_percentile(samples, tail), _percentile(samples, 1.0 - tail)],
            "seeds": len(seeds), "draws": draws, "bootstrap_seed": seed}


def seeds_won(a: Results, b: Results, groups: Mapping[str, str] | None = None) -> dict[str, int]:
    """On how many common seeds a's score beats b's (and ties, and loses)."""
    sa, sb = seed_scores(a, groups), seed_scores(b, groups)
    seeds = sorted(set(sa) & set(sb))
    wins = sum(sa[s] > sb[s] for s in seeds)
    ties = sum(sa[s] == sb[s] for s in seeds)
    return {"wins": wins, "ties": ties, "losses": len(seeds) - wins - ties, "seeds": len(seeds)}


def _grouped(tasks: Mapping[str, float], groups: Mapping[str, str] | None) -> dict[str, float]:
    """fingerprint (the task id where `groups` has none) -> the mean success of its tasks."""
    if not tasks:
        raise ValueError("a seed with no task results")
    members: dict[str, list[float]] = {}
    for task_id, value in tasks.items():
        fingerprint = (groups or {}).get(task_id)
        members.setdefault(f"id:{task_id}" if fingerprint is None else f"fp:{fingerprint}", []).append(float(value))
    return {key: sum(values) / len(values) for key, values in members.items()}


def _percentile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, linear between neighbours (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
