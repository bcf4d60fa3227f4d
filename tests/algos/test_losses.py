"""Policy losses: sign of the update, PPO clipping, on-policy value, GSPO's sequence ratio."""

import math

import pytest
import torch
from torch import nn

from rlfw.algos import get_adv_est, get_policy_loss

CLIP = {"ppo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}  # DAPO's and GSPO's paper settings
AGG = {"ppo": "token-mean", "gspo": "seq-mean-token-mean"}


class TinyPolicy(nn.Module):
    """A context-free softmax policy: one row of logits per position over a small vocabulary."""

    def __init__(self, length: int, vocab: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.logits = nn.Parameter(torch.randn(length, vocab, generator=gen))  # [L, V]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, L] -> log-prob of each token [B, L]."""
        logp = torch.log_softmax(self.logits, dim=-1)  # [L, V]
        return logp.expand(tokens.shape[0], -1, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("loss_name", ["ppo", "gspo"])
@pytest.mark.parametrize("adv_name", ["grpo", "dr_grpo", "rloo"])
def test_one_step_raises_logp_of_rewarded_sample(loss_name, adv_name):
    policy = TinyPolicy(length=3, vocab=6)
    tokens = torch.tensor([[0, 1, 2], [3, 4, 5]])  # sample 0 rewarded, sample 1 not
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)  # ragged: sample 1 has 2 tokens
    adv = get_adv_est(adv_name)(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert adv[0] > 0 > adv[1]

    before = policy(tokens).detach()
    clip_low, clip_high = CLIP[loss_name]
    loss, _ = get_policy_loss(loss_name)(
        policy(tokens), before, adv, mask, clip_low=clip_low, clip_high=clip_high,
        loss_agg=AGG[loss_name],
    )
    loss.backward()
    with torch.no_grad():
        policy.logits -= 0.1 * policy.logits.grad  # one SGD step
    after = policy(tokens).detach()

    delta = after - before
    assert (delta[0] > 0).all(), delta  # every token of the rewarded sample became likelier
    assert (delta[1, :2] < 0).all(), delta  # every generated token of the other, less likely


def _ppo_clip_case():
    # old_logp = -1 everywhere; logp = -1 + log r, so the ratio is r exactly.
    ratios = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 1.0]])
    old_logp = torch.full((2, 3), -1.0)
    logp = (old_logp + ratios.log()).requires_grad_()
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # last token of row 1 masked out
    return logp, old_logp, adv, mask


def test_ppo_clipping_hand_values():
    logp, old_logp, adv, mask = _ppo_clip_case()
    loss, stats = get_policy_loss("ppo")(
        logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg="token-mean"
    )
    # clip range [0.8, 1.28]. per-token -min(r A, clip(r) A):
    # row 0, A = +2: r=1.5 -> -min(3.0, 2.56) = -2.56 (clipped)
    #                r=0.5 -> -min(1.0, 1.6)  = -1.0  (unclipped: PPO never clips upward here)
    #                r=1.1 -> -2.2                     (inside the range)
    # row 1, A = -1: r=1.5 -> -min(-1.5, -1.28) = 1.5 (unclipped)
    #                r=0.5 -> -min(-0.5, -0.8)  = 0.8 (clipped)
    #                r=1.0 -> masked out
    # token-mean over 5 tokens: (-2.56 - 1.0 - 2.2 + 1.5 + 0.8) / 5 = -3.46 / 5 = -0.692
    torch.testing.assert_close(loss, torch.tensor(-0.692))
    # clipped: row 0 token 0 and row 1 token 1 -> 2 of 5
    torch.testing.assert_close(stats["clip_frac"], torch.tensor(0.4))
    # (1.5 + 0.5 + 1.1 + 1.5 + 0.5) / 5 = 1.02
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.02))
    k3 = lambda r: (r - 1) - math.log(r)  # noqa: E731
    expected_kl = (2 * k3(1.5) + 2 * k3(0.5) + k3(1.1)) / 5  # = 0.11601...
    torch.testing.assert_close(stats["approx_kl"], torch.tensor(expected_kl))
    assert all(not v.requires_grad for v in stats.values())

    loss.backward()
    # d(-A r)/d logp = -A r on unclipped tokens, 0 on clipped or masked ones; then / 5
    expected_grad = torch.tensor([[0.0, -2 * 0.5, -2 * 1.1], [1.5, 0.0, 0.0]]) / 5
    torch.testing.assert_close(logp.grad, expected_grad)


def test_on_policy_ppo_is_minus_token_mean_advantage_and_plain_pg():
    policy = TinyPolicy(length=3, vocab=5, seed=1)
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -0.5])

    logp = policy(tokens)
    loss, stats = get_policy_loss("ppo")(
        logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.28, loss_agg="token-mean"
    )
    # ratio 1 everywhere: -(3 tokens * 1.0 + 1 token * -0.5) / 4 tokens = -2.5 / 4 = -0.625
    torch.testing.assert_close(loss, torch.tensor(-0.625))
    assert stats["clip_frac"] == 0 and stats["approx_kl"] == 0
    (ppo_grad,) = torch.autograd.grad(loss, policy.logits)

    # REINFORCE surrogate: -(1/N) sum over masked tokens of A * logp
    pg = -(adv[:, None] * policy(tokens) * mask).sum() / mask.sum()
    (pg_grad,) = torch.autograd.grad(pg, policy.logits)
    torch.testing.assert_close(ppo_grad, pg_grad)


def test_gspo_sequence_ratio_hand_value():
    old_logp = torch.full((2, 3), -2.0)
    # row 0: log-ratios [0.2, -0.1, (0.5 masked)] -> mean 0.05, s0 = e^0.05 = 1.0512711
    # row 1: log-ratios [0.4, -0.1, 0.0]          -> mean 0.1,  s1 = e^0.1  = 1.1051709
    logp = (old_logp + torch.tensor([[0.2, -0.1, 0.5], [0.4, -0.1, 0.0]])).requires_grad_()
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -1.0])
    s0, s1 = math.exp(0.05), math.exp(0.1)

    # wide clip range: nothing clipped
    loss, stats = get_policy_loss("gspo")(
        logp, old_logp, adv, mask, clip_low=0.9, clip_high=10.0, loss_agg="seq-mean-token-mean"
    )
    # per-sequence loss -A s: row 0 -> -s0, row 1 -> +s1; mean (-1.0512711 + 1.1051709) / 2
    torch.testing.assert_close(loss, torch.tensor((s1 - s0) / 2))  # 0.0269499
    # every token carries its sequence's ratio: (2 s0 + 3 s1) / 5
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor((2 * s0 + 3 * s1) / 5))
    loss.backward()
    # d/d logp_t = (1/2 seqs) * (1/|y_i|) * (-A_i s_i): row 0 -s0/4, row 1 +s1/6, masked 0
    expected = torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [s1 / 6, s1 / 6, s1 / 6]])
    torch.testing.assert_close(logp.grad, expected)


@pytest.mark.parametrize("clip", [(0.9, 10.0), (3e-4, 4e-4)])
def test_gspo_matches_the_papers_sequence_level_objective(clip):
    gen = torch.Generator().manual_seed(3)
    old_logp = -torch.rand(4, 5, generator=gen) * 3
    logp = (old_logp + 0.1 * torch.randn(4, 5, generator=gen)).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    loss, stats = get_policy_loss("gspo")(
        logp, old_logp, adv, mask, clip_low=clip[0], clip_high=clip[1],
        loss_agg="seq-mean-token-mean",
    )
    (grad,) = torch.autograd.grad(loss, logp)

    # J = mean_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log-ratio), written directly
    m = mask.float()
    s = torch.exp(((logp - old_logp) * m).sum(-1) / m.sum(-1))
    ref = -torch.minimum(s * adv, s.clamp(1 - clip[0], 1 + clip[1]) * adv).mean()
    (ref_grad,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)
    if clip[1] < 1e-3:  # every |mean log-ratio| here is far above 4e-4
        assert 0 < stats["clip_frac"] < 1


@pytest.mark.parametrize("loss_name", ["ppo", "gspo"])
def test_nothing_masked_gives_zero_loss_not_nan(loss_name):
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, stats = get_policy_loss(loss_name)(
        logp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), clip_low=0.2, clip_high=0.2,
        loss_agg=AGG[loss_name],
    )
    loss.backward()
    assert loss == 0 and torch.all(logp.grad == 0)
    assert all(torch.isfinite(v) for v in stats.values())


def test_bad_arguments_raise():
    ppo = get_policy_loss("ppo")
    x = torch.zeros(2, 3)
    kw = dict(clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
    with pytest.raises(ValueError, match="advantages must be"):
        ppo(x, x, torch.zeros(2, 3), x, **kw)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        ppo(x, torch.zeros(2, 4), torch.zeros(2), x, **kw)
    with pytest.raises(ValueError, match="clip_low"):
        ppo(x, x, torch.zeros(2), x, clip_low=1.0, clip_high=0.2, loss_agg="token-mean")
    with pytest.raises(ValueError, match="token-mean"):
        ppo(x, x, torch.zeros(2), x, clip_low=0.2, clip_high=0.2, loss_agg="sum")
