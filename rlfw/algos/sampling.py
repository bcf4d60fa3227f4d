"""DAPO's dynamic sampling (Yu et al. 2025): keep only groups whose rewards are not all equal.

A group whose episodes all got the same reward has zero group-relative advantage under ``grpo``,
``dr_grpo`` and ``rloo``, so it adds no policy-gradient signal, only dilutes the batch. DAPO
over-samples and drops such groups until the batch is full; the trainer decides whether to drop or
resample, this module only says which episodes to keep.
"""

from __future__ import annotations

import torch
from torch import Tensor


def nonconstant_groups(rewards: Tensor, group_ids: Tensor, *, atol: float = 1e-8) -> Tensor:
    """True for episodes whose group has max - min reward > atol. [N], [N] -> bool [N].

    A group of one episode is constant, so it is dropped too.
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length; got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)  # inverse: [N] in [0, G)
    num_groups = unique_ids.numel()
    empty = rewards.new_zeros(num_groups)  # [G]
    hi = empty.scatter_reduce(0, inverse, rewards, reduce="amax", include_self=False)  # [G]
    lo = empty.scatter_reduce(0, inverse, rewards, reduce="amin", include_self=False)  # [G]
    return (hi - lo)[inverse] > atol
