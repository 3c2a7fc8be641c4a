"""Group-relative advantages on hand-made groups."""

from __future__ import annotations

import math

import pytest

from omrl.train.rl.advantages import flat_groups, group_advantages


def test_flat_group_and_singleton_give_zero():
    adv = group_advantages([1.0, 1.0, 1.0, 0.0, 0.5], ["a", "a", "a", "b", "c"])
    assert adv == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert flat_groups([1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"]) == {"a"}


def test_known_rewards_give_known_values():
    # group x: rewards 0, 1 -> mean 0.5, sample std sqrt(0.5); group y: 1, 2, 3 -> mean 2, std 1
    adv = group_advantages([0.0, 3.0, 1.0, 1.0, 2.0], ["x", "y", "x", "y", "y"], eps=0.0)
    s = math.sqrt(0.5)
    assert adv == pytest.approx([-0.5 / s, 1.0, 0.5 / s, -1.0, 0.0])
    assert sum(adv[i] for i in (0, 2)) == pytest.approx(0.0)


def test_without_std_scaling_is_centered_reward():
    adv = group_advantages([0.0, 3.0, 1.0, 1.0, 2.0], ["x", "y", "x", "y", "y"], scale_std=False)
    assert adv == pytest.approx([-0.5, 1.0, 0.5, -1.0, 0.0])


def test_eps_keeps_small_spreads_finite():
    adv = group_advantages([0.0, 1e-12], ["g", "g"])
    assert all(math.isfinite(a) for a in adv) and abs(adv[0]) < 1e-6


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="reward 1 .*'g'"):
        group_advantages([1.0, None], ["g", "g"])
    with pytest.raises(ValueError, match="2 rewards but 1 group"):
        group_advantages([1.0, 2.0], ["g"])
