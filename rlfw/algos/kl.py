"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled by the policy.

John Schulman, "Approximating KL Divergence" (2020), with delta = logp - ref_logp and the
sampled token's ratio ref/pi = exp(-delta):

- ``k1`` = delta: unbiased, high variance, can be negative.
- ``k2`` = 0.5 * delta^2: biased (low bias when the policies are close), low variance, >= 0.
- ``k3`` = exp(-delta) + delta - 1: unbiased, low variance, >= 0 (GRPO's in-loss KL penalty).

Deviation: for ``k3`` the log-ratio ``ref_logp - logp`` is clamped to [-K3_LOG_RATIO_CLAMP,
K3_LOG_RATIO_CLAMP] = [-20, 20] before exp, so a token the reference finds far likelier than the
policy cannot overflow (e^20 ~ 4.9e8); beyond the clamp the gradient is zero. verl clamps the same
way. k1 and k2 are polynomial and are not clamped.

The trainer reduces the [B, L] result with ``losses.aggregate`` and adds ``beta * kl`` to the loss.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

K3_LOG_RATIO_CLAMP = 20.0


def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    log_ratio = (ref_logp - logp).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio) - log_ratio - 1.0


_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}
KL_KINDS: tuple[str, ...] = tuple(_ESTIMATORS)


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate of the given ``kind``. logp, ref_logp: [B, L] -> [B, L]."""
    if kind not in _ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {list(KL_KINDS)}")
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have one shape"
        )
    return _ESTIMATORS[kind](logp, ref_logp)
