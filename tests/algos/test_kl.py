"""KL-to-reference estimators."""

import math

import pytest
import torch

from rlfw.algos import KL_KINDS, kl_estimate


def test_hand_values():
    # policy prob 0.5, reference 0.25: delta = logp - ref_logp = ln 2 = 0.693147
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    ln2 = math.log(2)
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[ln2]]))
    # 0.5 * 0.480453 = 0.2402265
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.5 * ln2**2]]))
    # exp(-ln 2) + ln 2 - 1 = 0.5 + 0.693147 - 1 = 0.193147
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[0.5 + ln2 - 1]]))


def test_k2_k3_nonnegative_and_zero_on_equal():
    gen = torch.Generator().manual_seed(0)
    logp, ref = -3 * torch.rand(4, 8, generator=gen), -3 * torch.rand(4, 8, generator=gen)
    for kind in ("k2", "k3"):
        assert (kl_estimate(logp, ref, kind) >= 0).all()
        assert torch.all(kl_estimate(logp, logp, kind) == 0)


def test_k3_clamps_instead_of_overflowing():
    # ref_logp - logp = 100 is clamped to 20: e^20 - 20 - 1
    out = kl_estimate(torch.tensor([[-100.0]]), torch.tensor([[0.0]]), "k3")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([[math.exp(20) - 21]]))


def test_k1_and_k3_are_unbiased_monte_carlo():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=gen), -1)
    q = torch.softmax(torch.randn(6, generator=gen), -1)
    true_kl = float((p * (p.log() - q.log())).sum())
    tokens = torch.multinomial(p, 20000, replacement=True, generator=gen)[None]  # [1, 20000]
    logp, ref = p.log()[tokens], q.log()[tokens]
    for kind in ("k1", "k3"):
        assert abs(float(kl_estimate(logp, ref, kind).mean()) - true_kl) < 0.03 + 0.1 * true_kl


def test_unknown_kind_and_shape_mismatch():
    assert KL_KINDS == ("k1", "k2", "k3")
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    with pytest.raises(ValueError, match="one shape"):
        kl_estimate(torch.zeros(1, 2), torch.zeros(1, 3), "k1")
