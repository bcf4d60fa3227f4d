"""TrainBatch shape checks."""

import pytest
import torch

from rlfw.algos import TrainBatch


def _batch(**overrides):
    fields = dict(
        input_ids=torch.zeros(2, 5, dtype=torch.long),
        attention_mask=torch.ones(2, 5),
        loss_mask=torch.zeros(2, 5),
        old_logp=torch.zeros(2, 5),
        advantages=torch.zeros(2),
    )
    return TrainBatch(**(fields | overrides))


def test_valid_batch_and_to():
    batch = _batch(mm_inputs={"pixel_values": torch.zeros(2, 3, 4, 4)}).to("cpu")
    assert batch.ref_logp is None and batch.mm_inputs["pixel_values"].shape == (2, 3, 4, 4)


@pytest.mark.parametrize(
    "field, value",
    [
        ("loss_mask", torch.zeros(2, 4)),
        ("ref_logp", torch.zeros(3, 5)),
        ("advantages", torch.zeros(2, 5)),
        ("input_ids", torch.zeros(10, dtype=torch.long)),
    ],
)
def test_shape_mismatch_raises(field, value):
    with pytest.raises(ValueError, match="must"):
        _batch(**{field: value})
