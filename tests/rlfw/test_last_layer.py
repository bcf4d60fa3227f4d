"""The language model's last layer at the kept positions only (rlfw.models.last_layer) gives the
training forward the log-probs and gradients of transformers' layer at every position, runs its MLP
on the kept positions alone, and leaves forwards without kept positions (generation, plain calls)
to transformers' layer."""

import copy

import pytest
import torch

from rlfw.models.last_layer import LastLayerAtQueries, query_positions, trim_last_layer, untrim_last_layer
from rlfw.policy import sequence_logprobs
from rlfw.rollout.types import Segment
from tests.rlfw.test_train_speed import _logprobs_and_grads, _policy


def _layers(model):
    return [m for m in model.modules() if type(m).__name__.endswith("TextDecoderLayer") or type(m) is LastLayerAtQueries]


def _every_position_copy(model):
    ref = copy.deepcopy(model)
    assert untrim_last_layer(ref) == 1
    assert trim_last_layer(copy.deepcopy(ref)) == 1  # the round trip
    return ref


def _mixed(segments):
    """The test's segments plus one longer turn with four supervised tokens: rows of two lengths
    (right padding) and of two kept counts."""
    s = segments[0]
    longer = Segment(token_ids=s.token_ids + s.token_ids[-2:], loss_mask=s.loss_mask + [1, 1],
                     logprobs=s.logprobs + [0.0, 0.0], images=s.images)
    return [longer] + list(segments[1:])


@pytest.fixture
def mlp_rows():
    """The token count the last layer's MLP saw on each call, per model (a forward hook)."""
    seen = []

    def watch(model):
        _layers(model)[-1].mlp.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[:-1]))
        return seen

    return watch


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_training_forward_matches_the_layer_at_every_position(tmp_path, attn, lora_rank, mlp_rows):
    model, processor, segments = _policy(tmp_path, lora_rank=lora_rank, attn_implementation=attn)
    assert type(_layers(model)[-1]) is LastLayerAtQueries
    assert all(type(layer) is not LastLayerAtQueries for layer in _layers(model)[:-1])
    ref = _every_position_copy(model)
    assert ref.state_dict().keys() == model.state_dict().keys()
    segments = _mixed(segments)
    seen = mlp_rows(model)
    logp, mask, grads = _logprobs_and_grads(model, processor, segments)
    ref_logp, ref_mask, ref_grads = _logprobs_and_grads(ref, processor, segments)
    assert mask.sum(1).tolist()[:2] == [4.0, 2.0]
    assert seen == [torch.Size([len(segments), 4])]  # the MLP ran at 4 positions a row, not ~100
    torch.testing.assert_close(mask, ref_mask)
    torch.testing.assert_close(logp * mask, ref_logp * mask, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6)


def test_bf16_autocast_and_entropy_match_too(tmp_path):
    model, processor, segments = _policy(tmp_path, lora_rank=4, attn_implementation="eager")
    ref = _every_position_copy(model)
    segments = _mixed(segments)
    logp, mask, entropy = sequence_logprobs(model, processor, segments, want_entropy=True, autocast="bfloat16")
    ref_logp, _, ref_entropy = sequence_logprobs(ref, processor, segments, want_entropy=True, autocast="bfloat16")
    torch.testing.assert_close(logp * mask, ref_logp * mask, rtol=0.02, atol=0.02)  # bf16 rounding of either order
    torch.testing.assert_close(entropy, ref_entropy, rtol=0.02, atol=0.02)


def test_forwards_without_kept_positions_use_the_whole_layer(tmp_path, mlp_rows):
    """A plain forward (no query_positions) and one with a KV cache run the layer at every position,
    with transformers' outputs."""
    model, processor, segments = _policy(tmp_path, lora_rank=0, attn_implementation="eager")
    ref = _every_position_copy(model)
    seen = mlp_rows(model)
    from rlfw.models.processing import collate

    feats = [[processor.image_features(img) for img in s.images] for s in segments]
    batch = collate([s.token_ids for s in segments], feats, processor.image_token_id, processor.pad_token_id,
                    left_pad=False)
    with torch.no_grad():
        for use_cache in (False, True):
            out = model(**batch, use_cache=use_cache).logits
            torch.testing.assert_close(out, ref(**batch, use_cache=use_cache).logits)
    length = batch["input_ids"].shape[1]
    assert seen == [torch.Size([len(segments), length])] * 2


def test_query_positions_are_distinct_with_the_kept_ones_first():
    keep = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    positions = query_positions(keep)
    assert positions.tolist() == [[1, 3, 4], [0, 1, 2], [0, 1, 2]]
    assert all(len(set(row)) == len(row) for row in positions.tolist())
