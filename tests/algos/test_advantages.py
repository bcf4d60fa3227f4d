"""Advantage estimators against hand-computed values."""

import math

import pytest
import torch

from rlfw.algos import get_adv_est, group_stats

# Two groups of four: group 0 rewards [1, 0, 0, 0], group 1 rewards [1, 1, 0, 0].
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])

# group 0: mean 0.25; deviations 0.75, -0.25 x3; sum of squares 0.5625 + 3 * 0.0625 = 0.75;
#   unbiased var 0.75 / 3 = 0.25, std 0.5.
# group 1: mean 0.5; deviations +-0.5; sum of squares 4 * 0.25 = 1; var 1 / 3, std 1/sqrt(3).
S3 = math.sqrt(3.0)
EXPECTED = {
    # (r - mean) / std (eps = 1e-6 is below the tolerance)
    "grpo": [1.5, -0.5, -0.5, -0.5, 0.5 * S3, 0.5 * S3, -0.5 * S3, -0.5 * S3],
    # r - mean
    "dr_grpo": [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5],
    # r_i - mean of the other three:
    #   group 0: 1 - 0 = 1;  0 - 1/3 = -1/3
    #   group 1: 1 - 1/3 = 2/3;  0 - 2/3 = -2/3
    "rloo": [1.0, -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hand_values(name):
    adv = get_adv_est(name)(REWARDS, GROUPS)
    torch.testing.assert_close(adv, torch.tensor(EXPECTED[name]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_group_order_and_ids_do_not_matter(name):
    # Same episodes, shuffled, with non-contiguous group ids (7 and 3 instead of 0 and 1).
    perm = torch.tensor([5, 0, 7, 2, 4, 1, 6, 3])
    ids = torch.where(GROUPS == 0, 7, 3)[perm]
    adv = get_adv_est(name)(REWARDS[perm], ids)
    torch.testing.assert_close(adv, torch.tensor(EXPECTED[name])[perm], atol=1e-5, rtol=0)


def test_unequal_group_sizes():
    # group 4: [2, 0] (size 2); group 9: [3, 0, 0] (size 3)
    rewards = torch.tensor([3.0, 2.0, 0.0, 0.0, 0.0])
    ids = torch.tensor([9, 4, 9, 4, 9])
    # grpo, group 4: mean 1, deviations +-1, unbiased var (1 + 1) / 1 = 2, std sqrt 2 -> +-1/sqrt2
    # grpo, group 9: mean 1, deviations 2, -1, -1; var (4 + 1 + 1) / 2 = 3 -> 2/sqrt3, -1/sqrt3
    grpo = get_adv_est("grpo")(rewards, ids)
    s2 = math.sqrt(2.0)
    torch.testing.assert_close(
        grpo, torch.tensor([2 / S3, 1 / s2, -1 / S3, -1 / s2, -1 / S3]), atol=1e-5, rtol=0
    )
    # dr_grpo: r - mean (both means are 1)
    dr = get_adv_est("dr_grpo")(rewards, ids)
    torch.testing.assert_close(dr, torch.tensor([2.0, 1.0, -1.0, -1.0, -1.0]))
    # rloo, group 4: 2 - 0 = 2, 0 - 2 = -2; group 9: 3 - 0 = 3, 0 - (3 + 0)/2 = -1.5
    rloo = get_adv_est("rloo")(rewards, ids)
    torch.testing.assert_close(rloo, torch.tensor([3.0, 2.0, -1.5, -2.0, -1.5]))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_constant_group_gives_zeros(name):
    # group 0 constant at 1 (grpo: 0 / (0 + eps) = 0), group 1 informative
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0])
    ids = torch.tensor([0, 0, 0, 1, 1])
    adv = get_adv_est(name)(rewards, ids)
    assert torch.all(adv[:3] == 0)
    assert torch.isfinite(adv).all()


def test_grpo_singleton_group_is_zero_and_rloo_rejects_it():
    rewards = torch.tensor([1.0, 0.0, 1.0])
    ids = torch.tensor([0, 0, 1])
    adv = get_adv_est("grpo")(rewards, ids)
    # singleton: std taken as 0 -> 0 / eps = 0; pair [1, 0]: std 1/sqrt2 -> +-0.5*sqrt2
    torch.testing.assert_close(adv, torch.tensor([0.5 * math.sqrt(2), -0.5 * math.sqrt(2), 0.0]))
    with pytest.raises(ValueError, match="groups \\[1\\]"):
        get_adv_est("rloo")(rewards, ids)


def test_group_stats_matches_torch_std():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=gen)
    ids = torch.tensor([2, 0, 1, 2, 0, 1, 2, 0, 2, 2, 1, 0])
    stats = group_stats(rewards, ids)
    for g in (0, 1, 2):
        sel = ids == g
        torch.testing.assert_close(stats.mean[sel], rewards[sel].mean().expand(int(sel.sum())))
        torch.testing.assert_close(stats.std[sel], rewards[sel].std().expand(int(sel.sum())))


def test_integer_rewards_and_shape_errors():
    adv = get_adv_est("dr_grpo")(torch.tensor([1, 0]), torch.tensor([0, 0]))
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))
    with pytest.raises(ValueError, match="same length"):
        get_adv_est("grpo")(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        get_adv_est("grpo")(torch.zeros(2), torch.zeros(2))


def test_step_advantages_compare_turns_within_an_anchor_state():
    """Three turns from the same observation: the one whose return is highest gets the positive
    step advantage; a turn with no twin in its anchor group gets 0."""
    from rlfw.algos import step_advantages

    returns = torch.tensor([0.9, 0.0, 0.5, 1.0])
    anchors = torch.tensor([0, 0, 0, 1])
    adv = step_advantages(returns, anchors)
    mean, std = returns[:3].mean(), returns[:3].std()
    torch.testing.assert_close(adv[:3], (returns[:3] - mean) / (std + 1e-6))
    assert adv[0] > adv[2] > 0 > adv[1]
    assert adv[3] == 0


@pytest.mark.parametrize("name, expected", [
    # anchor 0 holds returns [0.9, 0.0, 0.6] (mean 0.5); anchor 1 has one turn, so no baseline: 0
    ("dr_grpo", [0.4, -0.5, 0.1, 0.0]),  # return - anchor mean, no std
    ("rloo", [0.6, -0.75, 0.15, 0.0]),  # 3/2 * (return - anchor mean), leave-one-out
])
def test_step_advantages_use_the_configured_estimator(name, expected):
    """GiGPO's step level normalises like the episode level: by the run's advantage_estimator."""
    from rlfw.algos import get_adv_est, step_advantages

    adv = step_advantages(torch.tensor([0.9, 0.0, 0.6, 1.0]), torch.tensor([0, 0, 0, 1]), get_adv_est(name))
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_turn_returns_discount_from_the_end_and_anchor_on_the_observation():
    """rlfw.train.turn_returns: gamma**k before the outcome; identical prompts within a group share
    an anchor, the same prompt in another group does not."""
    import numpy as np

    from rlfw.train import turn_returns
    from rlfw.rollout.types import Episode, Segment, Task

    img_a, img_b = np.zeros((2, 2, 3), np.uint8), np.ones((2, 2, 3), np.uint8)

    def seg(prompt, image, reply):
        return Segment(prompt + reply, [0] * len(prompt) + [1] * len(reply), [0.0] * (len(prompt) + len(reply)), [image])

    won = Episode(Task(seed=1), 0, [seg([1, 2], img_a, [7]), seg([1, 3], img_b, [8])], reward=1.0)
    lost = Episode(Task(seed=1), 0, [seg([1, 2], img_a, [9]), seg([1, 2], img_b, [9])], reward=0.0)
    other = Episode(Task(seed=2), 1, [seg([1, 2], img_a, [7])], reward=1.0)
    returns, anchors = turn_returns([won, lost, other], gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([0.5, 1.0, 0.0, 0.0, 1.0]))
    a = anchors.tolist()
    assert a[0] == a[2]  # same tokens and image in group 0, different replies
    assert len({a[0], a[1], a[3], a[4]}) == 4  # other image, other text, other group
