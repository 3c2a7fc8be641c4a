"""GAE over multi-turn token sequences against hand-computed references (omrl/train/rl/gae.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omrl.train.rl.gae import (  # noqa: E402
    explained_variance,
    gae,
    masked_gae,
    masked_whiten,
    place_turn_rewards,
    turn_spans,
    turn_starts,
)

G, L = 0.9, 0.8  # gamma, lambda of the hand-computed cases


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(a, b):
    assert torch.allclose(a, t(*b) if not isinstance(b, torch.Tensor) else b, atol=1e-5), (a, b)


def test_token_level_gae_matches_the_hand_computed_recursion():
    # d2 = 1 - .7 = .3; d1 = .9*.7 - .6 = .03; d0 = .9*.6 - .5 = .04
    # A2 = .3; A1 = .03 + .72*.3 = .246; A0 = .04 + .72*.246 = .21712
    out = gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), G, L, level="token")
    close(out.advantages, [[0.21712, 0.246, 0.3]])
    close(out.returns, [[0.71712, 0.846, 1.0]])
    close(out.value_mask, [[1, 1, 1]])


def test_gamma_and_lambda_one_give_reward_to_go_minus_value():
    out = gae(t([0, 0.5, 0, 1]), t([0.1, 0.2, 0.3, 0.4]), t([1, 1, 1, 1]), 1.0, 1.0)
    close(out.returns, [[1.5, 1.5, 1.0, 1.0]])
    close(out.advantages, [[1.4, 1.3, 0.7, 0.6]])


def test_environment_tokens_are_skipped_not_decayed_and_get_nothing():
    # The same three steps as above with two observation tokens (values 9: must be ignored) in between.
    mask = t([1, 0, 0, 1, 1])
    out = gae(t([0, 0, 0, 0, 1]), t([0.5, 9, 9, 0.6, 0.7]), mask, G, L)
    close(out.advantages, [[0.21712, 0, 0, 0.246, 0.3]])
    close(out.returns, [[0.71712, 0, 0, 0.846, 1.0]])
    close(out.value_mask, mask)


def test_a_terminal_reward_after_trailing_env_tokens_reaches_the_last_assistant_token_undecayed():
    mask = t([1, 1, 0, 0])
    # On a masked token (where a naive placement would put it) it is moved back to the step before it.
    out = gae(t([0, 0, 0, 1]), t([0.5, 0.7, 9, 9]), mask, G, L)
    close(out.advantages, [[0.346, 0.3, 0, 0]])  # A1 = 1 - .7; A0 = .9*.7 - .5 + .72*.3
    # place_turn_rewards puts it on the last trainable token in the first place.
    placed = place_turn_rewards(mask, [[0.0]], terminal=[1.0])
    close(placed, [[0, 1, 0, 0]])
    close(gae(placed, t([0.5, 0.7, 9, 9]), mask, G, L).advantages, [[0.346, 0.3, 0, 0]])


def test_turn_rewards_land_on_each_turn_s_last_trainable_token():
    mask = t([0, 1, 1, 0, 0, 1, 0], [1, 0, 1, 1, 1, 0, 0])
    assert turn_spans(mask[0]) == [(1, 2), (5, 5)] and turn_spans([1, 1]) == [(0, 1)]
    placed = place_turn_rewards(mask, [[0.5, 2.0], [1.0, 3.0, 4.0]], terminal=[0.25, 0.0])
    # Row 1 has two runs for three rewards: the extra one adds to the last run.
    close(placed, [[0, 0, 0.5, 0, 0, 2.25, 0], [1.0, 0, 0, 0, 7.0, 0, 0]])
    close(turn_starts(mask), [[0, 1, 0, 0, 0, 1, 0], [1, 0, 1, 0, 0, 0, 0]])
    close(place_turn_rewards(t([0, 0]), [[1.0]]), [[0, 0]])  # no trainable token: nothing to reward


def test_turn_level_gae_one_value_and_one_advantage_per_turn():
    # Turns at tokens 0-1 (reward .5, V .2 read at token 0) and 4-6 (reward 1, V .4 at token 4).
    mask = t([1, 1, 0, 0, 1, 1, 1, 0])
    rewards = place_turn_rewards(mask, [[0.5, 1.0]])
    values = t([0.2, 9, 9, 9, 0.4, 9, 9, 9])
    out = gae(rewards, values, mask, G, L, level="turn")
    # d1 = 1 - .4 = .6 = A1; d0 = .5 + .9*.4 - .2 = .66; A0 = .66 + .72*.6 = 1.092
    close(out.advantages, [[1.092, 1.092, 0, 0, 0.6, 0.6, 0.6, 0]])
    close(out.returns, [[1.292, 0, 0, 0, 1.0, 0, 0, 0]])
    close(out.value_mask, [[1, 0, 0, 0, 1, 0, 0, 0]])
    # Token level on the same sequence decays per trainable token instead (5 steps, not 2).
    token = gae(rewards, torch.zeros(1, 8), mask, 0.5, 1.0, level="token")
    close(token.advantages, [[0.25 + 0.0625, 0.5 + 0.125, 0, 0, 0.25, 0.5, 1.0, 0]])


def test_turn_level_with_a_terminal_reward_on_a_trailing_observation():
    mask = t([1, 0, 1, 1, 0, 0])
    out = gae(t([0, 0, 0, 0, 0, 1]), t([0.3, 9, 0.5, 9, 9, 9]), mask, G, L, level="turn")
    # A1 = 1 - .5 = .5; A0 = .9*.5 - .3 + .72*.5 = .51
    close(out.advantages, [[0.51, 0, 0.5, 0.5, 0, 0]])


def test_rows_of_a_batch_are_independent():
    one = gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), G, L)
    both = gae(t([0, 0, 1], [0, 1, 0]), t([0.5, 0.6, 0.7], [0.1, 0.2, 0]), t([1, 1, 1], [1, 1, 0]), G, L)
    close(both.advantages[:1], one.advantages)
    # Row 2: d1 = 1 - .2 = .8; d0 = .9*.2 - .1 = .08; A0 = .08 + .72*.8 = .656
    close(both.advantages[1:], [[0.656, 0.8, 0]])


def test_whitening_uses_valid_tokens_only():
    out = masked_whiten(t([1, 2, 3, 100]), t([1, 1, 1, 0]))
    close(out, [[-1, 0, 1, 0]])  # mean 2, unbiased variance 1; the masked 100 changes nothing


def test_explained_variance_and_errors():
    mask = t([1, 1, 1, 0])
    assert explained_variance(t([1, 2, 3, 7]), t([1, 2, 3, 0]), mask) == pytest.approx(1.0)
    assert explained_variance(t([0, 0, 0, 0]), t([1, 2, 3, 0]), mask) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="level"):
        gae(t([0]), t([0]), t([1]), level="episode")
    with pytest.raises(ValueError, match="shapes"):
        masked_gae(t([0, 1]), t([0]), t([1]))

