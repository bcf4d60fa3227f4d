"""DAPO dynamic-sampling mask."""

import torch

from rlfw.algos import get_adv_est, nonconstant_groups


def test_hand_example():
    # group 0: [1, 1, 1] constant -> drop; group 1: [0, 1] -> keep;
    # group 2: [0.5, 0.5 + 1e-9] equal within atol=1e-8 -> drop; group 3: [2] singleton -> drop
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0, 0.5 + 1e-9, 1.0, 2.0], dtype=torch.float64)
    ids = torch.tensor([0, 1, 0, 2, 1, 2, 0, 3])
    keep = nonconstant_groups(rewards, ids)
    assert keep.tolist() == [False, True, False, False, True, False, False, False]
    assert keep.dtype == torch.bool


def test_kept_groups_are_exactly_those_with_nonzero_grpo_advantage():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    keep = nonconstant_groups(rewards, ids)
    adv = get_adv_est("grpo")(rewards, ids)
    assert keep.tolist() == [False, False, True, True, False, False]
    assert torch.equal(keep, adv != 0)
