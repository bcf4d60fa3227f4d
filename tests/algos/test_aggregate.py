"""Loss aggregation modes and the entropy helper."""

import math

import pytest
import torch

from rlfw.algos import LOSS_AGG_MODES, aggregate, entropy_from_logits

NAN = float("nan")
# Ragged rows of 2 and 3 tokens, and an all-masked (padding) row. NaN where masked: never read.
X = torch.tensor([[1.0, 2.0, NAN], [4.0, 5.0, 6.0], [NAN, NAN, NAN]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])

EXPECTED = {
    # (1 + 2 + 4 + 5 + 6) / 5 tokens = 18 / 5
    "token-mean": 3.6,
    # row means 1.5 and 5.0; the empty row is not a sequence: (1.5 + 5.0) / 2
    "seq-mean-token-mean": 3.25,
    # row sums 3 and 15: (3 + 15) / 2
    "seq-mean-token-sum": 9.0,
}


def test_modes_are_all_tested():
    assert set(LOSS_AGG_MODES) == set(EXPECTED)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.long])
def test_hand_values(mode, mask_dtype):
    out = aggregate(X, MASK.to(mask_dtype), mode)
    torch.testing.assert_close(out, torch.tensor(EXPECTED[mode]))


def test_seq_mean_token_sum_divides_by_constant_max_tokens():
    # Dr. GRPO: (3 + 15) / 2 sequences / max_tokens 3 = 3.0
    torch.testing.assert_close(
        aggregate(X, MASK, "seq-mean-token-sum", max_tokens=3), torch.tensor(3.0)
    )


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_all_masked_is_zero_with_zero_gradient(mode):
    x = torch.randn(2, 3, requires_grad=True)
    out = aggregate(x, torch.zeros(2, 3), mode)
    out.backward()
    assert out == 0 and torch.all(x.grad == 0)


def test_gradient_weights():
    x = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    aggregate(x, mask, "seq-mean-token-mean").backward()
    # 1/2 per sequence, split over its tokens: row 0 1/4 each, row 1 1/6 each
    expected = torch.tensor([[1 / 4, 1 / 4, 0], [1 / 6, 1 / 6, 1 / 6]])
    torch.testing.assert_close(x.grad, expected)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="seq-mean-token-sum"):
        aggregate(X, MASK, "token-mean", max_tokens=3)
    with pytest.raises(ValueError, match="valid"):
        aggregate(X, MASK, "mean")
    with pytest.raises(ValueError, match="one shape"):
        aggregate(X, MASK[:, :2], "token-mean")


def test_entropy_hand_values():
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0],  # uniform over 4: ln 4
             [1000.0, 0.0, 0.0, 0.0]],  # one-hot in practice: 0, and no overflow
            [[0.0, 0.0, -math.inf, -math.inf],  # two banned tokens: uniform over 2, ln 2
             [5.0, 5.0, 5.0, 5.0]],  # shift invariant: ln 4
        ],
        requires_grad=True,
    )
    ent = entropy_from_logits(logits)
    expected = torch.tensor([[math.log(4), 0.0], [math.log(2), math.log(4)]])
    torch.testing.assert_close(ent, expected)
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_matches_categorical():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0)) * 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)
