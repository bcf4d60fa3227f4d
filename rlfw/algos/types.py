"""Typed containers the trainer passes to the policy update.

Alignment convention for every [B, T] tensor: position t describes token ``input_ids[:, t]``, so
``old_logp[:, t] = log pi_old(input_ids[:, t] | input_ids[:, :t], images)``. Position 0 has no
prediction and prompt / environment-observation tokens are not the model's actions, so
``loss_mask`` is 1 only on tokens the model generated (every assistant turn of a multi-turn
episode) and 0 elsewhere, including padding. The trainer computes the current ``logp`` with the
same alignment (shift the logits by one) and calls a policy loss with ``mask=loss_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class TrainBatch:
    """One (micro-)batch of episodes for the policy update; B episodes padded to length T."""

    input_ids: Tensor  # [B, T] long: prompt, observations and generated turns, right-padded
    attention_mask: Tensor  # [B, T] 0/1: 1 on real tokens, 0 on padding
    loss_mask: Tensor  # [B, T] 0/1: 1 only on model-generated tokens
    old_logp: Tensor  # [B, T] float: log-probs of input_ids under the sampling policy
    advantages: Tensor  # [B] float: one per episode, from an advantage estimator
    ref_logp: Tensor | None = None  # [B, T] float: under the reference policy; None without KL
    # model-specific multimodal inputs passed through untouched (pixel_values, image_grid_thw, ...)
    mm_inputs: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T]; got {tuple(self.input_ids.shape)}")
        shape = self.input_ids.shape
        named = {
            "attention_mask": self.attention_mask,
            "loss_mask": self.loss_mask,
            "old_logp": self.old_logp,
            "ref_logp": self.ref_logp,
        }
        for name, t in named.items():
            if t is not None and t.shape != shape:
                raise ValueError(
                    f"{name} must match input_ids {tuple(shape)}; got {tuple(t.shape)}"
                )
        if self.advantages.shape != shape[:1]:
            raise ValueError(
                f"advantages must be [B] = [{shape[0]}]; got {tuple(self.advantages.shape)}"
            )

    def to(self, device: torch.device | str) -> TrainBatch:
        """A copy with every tensor (mm_inputs included) moved to ``device``."""
        return TrainBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            old_logp=self.old_logp.to(device),
            advantages=self.advantages.to(device),
            ref_logp=None if self.ref_logp is None else self.ref_logp.to(device),
            mm_inputs={k: v.to(device) for k, v in self.mm_inputs.items()},
        )
