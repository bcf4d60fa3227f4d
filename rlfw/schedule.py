"""The one learning-rate schedule of rlfw, for RL (`rlfw.policy`) and SFT (`rlfw.sft`) alike.

Linear warmup, then constant, then a cosine from 1 to `min_ratio` over the last `decay_steps`
steps. The factor is a function of the training step alone, never of how many optimizer steps ran
before: an RL step whose episodes were all dropped (dynamic sampling) or that stopped early
(`algo.target_kl`) does not shift the schedule of the steps after it, and a resumed run needs no
scheduler state.
"""

from __future__ import annotations

import math


def lr_factor(step: int, total_steps: int, warmup_steps: int = 0, decay_steps: int = 0,
              min_ratio: float = 0.0) -> float:
    """LR multiplier for 0-based training step `step` of `total_steps`.

    Warmup: (step + 1) / warmup_steps for the first warmup_steps steps. Decay: the cosine starts at
    step total_steps - decay_steps and would reach min_ratio at step total_steps, one past the last
    (as Hugging Face's cosine schedule), so no step trains at exactly the floor.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_start = total_steps - decay_steps
    if decay_steps <= 0 or step < decay_start:
        return 1.0
    return _cosine((step - decay_start) / decay_steps, min_ratio)


def lr_factor_by_time(step: int, progress: float, warmup_steps: int = 0, decay_fraction: float = 0.0,
                      min_ratio: float = 0.0) -> float:
    """LR multiplier for a run sized by wall time: `progress` is the fraction of its time budget spent
    (0 at the start, 1 at the limit), so the same schedule fills the budget on a fast machine and a
    slow one. Warmup still counts 0-based steps; the cosine spans the last `decay_fraction` of the
    time and reaches `min_ratio` at the limit, where the run stops."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_start = 1.0 - decay_fraction
    if decay_fraction <= 0 or progress < decay_start:
        return 1.0
    return _cosine((progress - decay_start) / decay_fraction, min_ratio)


def _cosine(fraction: float, min_ratio: float) -> float:
    """From 1 at `fraction` 0 to `min_ratio` at 1 and past it."""
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, fraction)))
