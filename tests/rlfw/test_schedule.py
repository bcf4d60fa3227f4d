"""rlfw.schedule.lr_factor: the one LR schedule of RL and SFT, with hand-computed values."""

import math

import pytest

from rlfw.schedule import lr_factor


def test_warmup_constant_and_cosine_to_the_floor():
    # 10 steps: warmup 2, then a cosine over all 8 remaining steps down towards 0.1
    f = [lr_factor(i, 10, warmup_steps=2, decay_steps=8, min_ratio=0.1) for i in range(10)]
    assert f[:3] == [0.5, 1.0, 1.0]  # (i + 1) / 2 while warming up; the cosine starts at 1
    assert f[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 8)))
    assert f[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))  # above the floor
    assert f == sorted(f[:2]) + sorted(f[2:], reverse=True)


def test_sft_shape_is_constant_then_decays_over_the_last_fraction():
    # 8 steps, the last 4 decay to 0: 1, 1, 1, 1, then cos over quarter turns
    f = [lr_factor(i, 8, decay_steps=4) for i in range(8)]
    assert f[:5] == [1.0] * 5
    assert f[5:] == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 4)) for k in (1, 2, 3)])


def test_no_decay_is_constant():
    assert {lr_factor(i, 10) for i in range(10)} == {1.0}
