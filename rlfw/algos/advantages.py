"""Group-relative advantage estimators: one scalar per episode from its outcome reward.

An episode is a whole multi-turn rollout with one outcome reward; episodes sampled for the same
prompt share a ``group_id``. Groups may come in any order and have different sizes (dynamic
sampling drops some episodes). Every estimator has the ``AdvEstFn`` signature::

    fn(rewards: Tensor[N] float, group_ids: Tensor[N] long, *, eps: float = 1e-6) -> Tensor[N]

and the trainer broadcasts the result over the episode's generated tokens.

- ``grpo``: (r - group mean) / (group std + eps). DeepSeekMath (Shao et al. 2024). The std is the
  *unbiased* one (divides by n - 1, ``torch.std``'s default), as in TRL. A group of one episode has
  no spread; its std is taken as 0, so its advantage is 0 / (0 + eps) = 0, as for a constant group.
- ``dr_grpo``: r - group mean, with no std division (Dr. GRPO, Liu et al. 2025, "Understanding
  R1-Zero-Like Training"). Their other change, a constant loss normaliser, is the
  ``seq-mean-token-sum`` aggregation with ``max_tokens`` in ``losses.py``.
- ``rloo``: r_i - mean of the *other* episodes in the group (REINFORCE leave-one-out, Ahmadian et
  al. 2024, "Back to Basics"). Equals n / (n - 1) * (r_i - group mean). Needs >= 2 episodes per
  group. The paper also describes a KL-shaped reward; here the reward is used as given.

Step-level credit for multi-turn episodes (``step_advantages``): GiGPO's anchor-state grouping
(Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"). Turns of one
group's episodes that saw the same observation form an anchor group; each turn's discounted
return-to-go is normalised within its anchor group, as ``grpo`` normalises episode rewards within
a task group (by the run's estimator: grpo, dr_grpo or rloo alike). The trainer adds
``step_advantage_weight`` times it to the episode-level advantage,
so at a junction several samples crossed, the move that reached the goal sooner is pushed up over
the others even when all of those episodes failed or all succeeded.

``eps`` is accepted by all estimators so they share one signature; only ``grpo`` uses it.
Group statistics are computed with ``index_add_`` (no Python loop over groups).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rlfw.algos.registry import AdvEstFn, register_adv_est


class GroupStats(NamedTuple):
    """Per-episode view of its group's statistics (each gathered back to [N])."""

    count: Tensor  # [N] number of episodes in the episode's group (as rewards' dtype)
    mean: Tensor  # [N] group mean reward
    std: Tensor  # [N] unbiased group std; 0 for groups of one episode


def group_stats(rewards: Tensor, group_ids: Tensor) -> GroupStats:
    """Count, mean and unbiased std of each episode's group. rewards, group_ids: [N]."""
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length; got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor; got {group_ids.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)  # inverse: [N] in [0, G)
    num_groups = unique_ids.numel()
    zeros = rewards.new_zeros(num_groups)  # [G]
    count = zeros.index_add(0, inverse, torch.ones_like(rewards))  # [G]
    mean = zeros.index_add(0, inverse, rewards) / count  # [G]
    centred = rewards - mean[inverse]  # [N]
    sq_dev = zeros.index_add(0, inverse, centred * centred)  # [G]
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()  # [G]; 0 when count == 1
    return GroupStats(count=count[inverse], mean=mean[inverse], std=std[inverse])


def _as_float(rewards: Tensor) -> Tensor:
    return rewards if rewards.is_floating_point() else rewards.float()


@register_adv_est("grpo")
def grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """(r - group mean) / (unbiased group std + eps). rewards, group_ids: [N] -> [N]."""
    stats = group_stats(rewards, group_ids)
    return (_as_float(rewards) - stats.mean) / (stats.std + eps)


@register_adv_est("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """r - group mean (Dr. GRPO: no std normalisation). ``eps`` is unused."""
    stats = group_stats(rewards, group_ids)
    return _as_float(rewards) - stats.mean


@register_adv_est("rloo")
def rloo(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """r_i - mean of the other episodes of its group. ``eps`` is unused.

    Raises ValueError if any group has fewer than 2 episodes (no leave-one-out baseline).
    """
    stats = group_stats(rewards, group_ids)
    if bool((stats.count < 2).any()):
        lonely = torch.unique(group_ids[stats.count < 2]).tolist()
        raise ValueError(
            f"rloo needs >= 2 episodes per group; groups {lonely} have 1. Sample more episodes "
            "per prompt, or drop singleton groups before computing advantages."
        )
    n = stats.count
    return n / (n - 1) * (_as_float(rewards) - stats.mean)


def step_advantages(returns: Tensor, anchor_ids: Tensor, estimator: AdvEstFn = grpo, *,
                    eps: float = 1e-6) -> Tensor:
    """GiGPO step-level advantage: each turn's return-to-go against its anchor group, by `estimator`
    (the run's ``advantage_estimator``; grpo: (return - anchor mean) / (anchor std + eps)).

    returns: [M] float, one per turn (the discounted return from that turn on); anchor_ids: [M]
    long, equal for turns of the same task group that saw the same observation. A turn whose
    observation no other turn of its group saw gets 0 (it has no baseline), as does an anchor
    group whose returns are all equal.
    """
    shared = group_stats(returns, anchor_ids).count >= 2  # [M]
    out = torch.zeros_like(_as_float(returns))  # [M]
    if bool(shared.any()):
        out[shared] = estimator(returns[shared], anchor_ids[shared], eps=eps)
    return out
