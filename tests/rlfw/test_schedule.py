"""rlfw.schedule: the one LR schedule of RL and SFT, by steps or by wall time, with hand-computed values."""

import math

import pytest

from rlfw.schedule import lr_factor, lr_factor_by_time


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


def test_by_time_warms_up_in_steps_then_decays_over_the_last_fraction_of_the_budget():
    assert [lr_factor_by_time(i, 0.9, warmup_steps=4, decay_fraction=0.5) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    f = [lr_factor_by_time(10, p, warmup_steps=4, decay_fraction=0.5, min_ratio=0.1) for p in (0.0, 0.5, 0.75, 1.0, 1.2)]
    assert f[:2] == [1.0, 1.0]  # constant through the first half of the time
    assert f[2] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f[3] == pytest.approx(0.1) and f[4] == pytest.approx(0.1)  # the floor at the limit and past it
    assert {lr_factor_by_time(10, p) for p in (0.0, 0.99, 2.0)} == {1.0}
