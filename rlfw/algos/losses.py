"""Policy losses (PPO-clip with DAPO's clip-higher, GSPO), loss aggregation and entropy.

Every loss has the ``PolicyLossFn`` signature::

    fn(logp, old_logp, advantages, mask, *, clip_low, clip_high, loss_agg, max_tokens=None)
        -> (scalar loss, {"clip_frac", "ratio_mean", "approx_kl"} detached scalars)

with ``logp, old_logp, mask: [B, L]`` and ``advantages: [B]`` (one per episode, broadcast over its
tokens). ``mask`` (bool or 0/1 float) is 1 on the tokens the model generated. There is no KL or
entropy term here: the trainer adds them (``kl.kl_estimate``, ``entropy_from_logits`` with
``aggregate``).

- ``ppo``: token-level clipped surrogate, -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with
  r = exp(logp - old_logp) (Schulman et al. 2017), with separate low/high clip ranges (DAPO's
  "clip-higher", Yu et al. 2025; DAPO uses clip_low=0.2, clip_high=0.28). This is GRPO's loss
  without the in-loss KL term. No dual-clip.
- ``gspo``: Group Sequence Policy Optimization (Zheng et al. 2025). The importance ratio is per
  sequence, s_i = exp(mean over the sequence's masked tokens of (logp - old_logp)), and is clipped
  with its own, much smaller ranges (the paper uses clip_low=3e-4, clip_high=4e-4). It is written in
  the paper's token form s_i,t = sg[s_i] * exp(logp_t - sg[logp_t]): every token carries the value
  s_i and the gradient s_i * grad logp_t. With ``loss_agg="seq-mean-token-mean"`` (GSPO's
  objective, and what verl hard-codes) this is exactly the paper's gradient; other modes re-weight
  sequences by their length.

Deviations, both as in verl: the log-ratio is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]
before exp so a stale token cannot overflow (the clamp zeroes the gradient beyond it; verl clamps
PPO at +-20 and GSPO at +10); stats are masked-token means for both losses, so for GSPO
``clip_frac`` is the token-weighted fraction of clipped sequences.

Aggregation (``aggregate``; modes and names as in verl's ``agg_loss``):

- ``token-mean``: sum over all masked tokens / number of masked tokens (DAPO). This is the mean
  over the batch it is given; the trainer (``rlfw.policy``) weights each micro-batch by its share of
  the mini-batch's tokens, so the accumulated gradient is the token mean over the whole mini-batch.
- ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (the original GRPO).
- ``seq-mean-token-sum``: mean over sequences of each sequence's token sum, divided by the constant
  ``max_tokens`` if given (Dr. GRPO normalises by a constant, the generation budget, instead of
  each sequence's length).

"Sequences" means rows with at least one masked token: an all-zero row is padding and is left out
of the sequence count. A batch with no masked tokens aggregates to 0 (never NaN), and values at
masked-out positions do not enter the result.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlfw.algos.registry import register_policy_loss

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to +-this before exp: e^20 ~ 4.9e8 is finite in fp32 and bf16."""


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the positions where mask is nonzero; 0 if there are none. x, mask: [B, L]."""
    m = mask.bool()
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1)


def _token_mean(per_token: Tensor, mask: Tensor, max_tokens: int | None) -> Tensor:
    return masked_mean(per_token, mask)


def _seq_sums(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    m = mask.bool()
    sums = torch.where(m, per_token, torch.zeros_like(per_token)).sum(-1)  # [B]
    lengths = m.sum(-1)  # [B]
    nonempty = lengths > 0  # [B]
    return sums, lengths, nonempty


def _mean_over_nonempty(per_seq: Tensor, nonempty: Tensor) -> Tensor:
    return torch.where(nonempty, per_seq, torch.zeros_like(per_seq)).sum() / nonempty.sum().clamp(
        min=1
    )


def _seq_mean_token_mean(per_token: Tensor, mask: Tensor, max_tokens: int | None) -> Tensor:
    sums, lengths, nonempty = _seq_sums(per_token, mask)
    return _mean_over_nonempty(sums / lengths.clamp(min=1), nonempty)


def _seq_mean_token_sum(per_token: Tensor, mask: Tensor, max_tokens: int | None) -> Tensor:
    sums, _, nonempty = _seq_sums(per_token, mask)
    loss = _mean_over_nonempty(sums, nonempty)
    return loss / max_tokens if max_tokens is not None else loss


_AGGREGATORS: dict[str, Callable[[Tensor, Tensor, int | None], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
}
LOSS_AGG_MODES: tuple[str, ...] = tuple(_AGGREGATORS)


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str, *, max_tokens: int | None = None
) -> Tensor:
    """Reduce a per-token loss [B, L] over ``mask`` [B, L] to a scalar (see the module docstring).

    ``max_tokens`` (a positive constant) is only meaningful for ``seq-mean-token-sum``; passing it
    with another mode raises rather than being ignored.
    """
    if mode not in _AGGREGATORS:
        raise ValueError(f"unknown loss_agg {mode!r}; valid: {list(LOSS_AGG_MODES)}")
    if per_token.shape != mask.shape:
        raise ValueError(
            f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must have one shape"
        )
    if max_tokens is not None:
        if mode != "seq-mean-token-sum":
            raise ValueError(
                f"max_tokens={max_tokens} only applies to loss_agg='seq-mean-token-sum', not "
                f"{mode!r}; set max_tokens to None or change loss_agg"
            )
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive; got {max_tokens}")
    return _AGGREGATORS[mode](per_token, mask, max_tokens)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim: [B, L, V] -> [B, L].

    Computed from ``log_softmax`` (stable for large logits); -inf logits (banned tokens) contribute
    0 and give no NaN gradient. Computed in the logits' dtype: upcast bf16 logits first if the
    entropy feeds the loss and precision matters.
    """
    logp = torch.log_softmax(logits, dim=-1)
    finite_logp = logp.clamp(min=torch.finfo(logp.dtype).min)  # -inf -> most negative finite
    return -(logp.exp() * finite_logp).sum(-1)


def _check_loss_args(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low, clip_high
) -> None:
    if logp.dim() != 2 or logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, old_logp and mask must all be [B, L]; got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must be [B] = [{logp.shape[0]}] (one per sequence); "
            f"got {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(
            f"need 0 <= clip_low < 1 and clip_high >= 0; got clip_low={clip_low}, "
            f"clip_high={clip_high}"
        )


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """Per-token -min(r A, clip(r) A) [B, L], and where the clipped term is active [B, L]."""
    adv = advantages.unsqueeze(-1)  # [B, 1]
    unclipped = -adv * ratio  # [B, L]
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, L]
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _stats(
    ratio: Tensor, clip_active: Tensor, token_log_ratio: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """Detached masked-token means. token_log_ratio: clamped per-token logp - old_logp [B, L]."""
    ratio, token_log_ratio = ratio.detach(), token_log_ratio.detach()
    return {
        "clip_frac": masked_mean(clip_active.to(ratio.dtype), mask),
        "ratio_mean": masked_mean(ratio, mask),
        # k3 estimate of KL(old || new) on tokens sampled by the old policy: (r - 1) - log r
        "approx_kl": masked_mean(token_log_ratio.exp() - 1.0 - token_log_ratio, mask),
    }


@register_policy_loss("ppo")
def ppo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    max_tokens: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO-clip with separate low/high ranges. [B, L], [B, L], [B], [B, L] -> scalar."""
    _check_loss_args(logp, old_logp, advantages, mask, clip_low, clip_high)
    log_ratio = (logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, L]
    ratio = log_ratio.exp()  # [B, L]
    per_token, clip_active = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss = aggregate(per_token, mask, loss_agg, max_tokens=max_tokens)
    return loss, _stats(ratio, clip_active, log_ratio, mask)


@register_policy_loss("gspo")
def gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    max_tokens: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: sequence-level ratio in token form, clipped. Use loss_agg='seq-mean-token-mean'."""
    _check_loss_args(logp, old_logp, advantages, mask, clip_low, clip_high)
    m = mask.bool()
    # the sequence ratio only enters through sg[.], so compute it without a graph
    token_log_ratio = (logp.detach() - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    token_log_ratio = torch.where(m, token_log_ratio, torch.zeros_like(token_log_ratio))  # [B, L]
    seq_log_ratio = token_log_ratio.sum(-1) / m.sum(-1).clamp(min=1)  # [B] log s_i
    # log s_i,t = sg[log s_i] + logp_t - sg[logp_t]: value log s_i, gradient grad logp_t
    log_ratio = seq_log_ratio.unsqueeze(-1) + logp - logp.detach()  # [B, L]
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()  # [B, L], every token of row i holds s_i
    per_token, clip_active = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    loss = aggregate(per_token, mask, loss_agg, max_tokens=max_tokens)
    return loss, _stats(ratio, clip_active, token_log_ratio, mask)
