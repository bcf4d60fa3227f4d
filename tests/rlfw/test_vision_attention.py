"""The vision tower's batched attention (rlfw.models.vision_attention) computes what transformers'
per-image loop does, forward and backward, in one call a layer for equal-sized images, and falls
back to the loop for mixed sizes."""

import copy

import pytest
import torch
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

from rlfw.models.vision_attention import PackedVisionAttention, pack_vision_attention, unpack_vision_attention
from rlfw.policy import sequence_logprobs
from tests.rlfw.test_train_speed import _policy


def _per_image_copy(model):
    """A copy of `model` with transformers' own vision attention (the per-image loop)."""
    ref = copy.deepcopy(model)
    assert unpack_vision_attention(ref) == len(_visual(ref).blocks)
    assert pack_vision_attention(copy.deepcopy(ref)) == len(_visual(ref).blocks)  # the round trip
    return ref


def _visual(model):
    return model.get_base_model().model.visual if hasattr(model, "get_base_model") else model.model.visual


def _tower(model, grids, seed=0):
    """The vision tower's merged features for images of the given (h, w) patch grids, and the
    gradient of a fixed function of them with respect to the tower's parameters."""
    visual = _visual(model)
    grid_thw = torch.tensor([[1, h, w] for h, w in grids])
    g = torch.Generator().manual_seed(seed)
    patch_dim = 3 * visual.config.temporal_patch_size * visual.config.patch_size ** 2
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), patch_dim, generator=g)
    visual.zero_grad(set_to_none=True)
    out = visual(pixels, grid_thw=grid_thw).pooler_output
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in visual.named_parameters() if p.grad is not None}


@pytest.fixture
def attention_calls(monkeypatch):
    """How many times the eager attention kernel ran."""
    calls = []
    eager = qwen3_vl.eager_attention_forward

    def counting(*args, **kwargs):
        calls.append(args[1].shape[0])  # the batch of the query
        return eager(*args, **kwargs)

    monkeypatch.setattr(qwen3_vl, "eager_attention_forward", counting)
    return calls


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_loaded_models_attend_over_equal_sized_images_in_one_call_as_the_loop_does(tmp_path, attn):
    model, processor, segments = _policy(tmp_path, lora_rank=0, attn_implementation=attn)
    visual = _visual(model)
    assert all(type(b.attn) is PackedVisionAttention for b in visual.blocks)
    ref = _per_image_copy(model)
    assert ref.state_dict().keys() == model.state_dict().keys()
    grids = [(7, 7)] * 5
    out, grads = _tower(model, grids)
    ref_out, ref_grads = _tower(ref, grids)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6)
    # and so the whole policy's log-probs on maze turns
    logp, mask, _ = sequence_logprobs(model, processor, segments)
    ref_logp, _, _ = sequence_logprobs(ref, processor, segments)
    torch.testing.assert_close(logp * mask, ref_logp * mask, rtol=1e-5, atol=1e-6)


def test_equal_sizes_make_one_call_a_layer_and_mixed_sizes_keep_the_loop(tmp_path, attention_calls):
    model, _, _ = _policy(tmp_path, lora_rank=0, attn_implementation="eager")
    depth = len(_visual(model).blocks)
    _tower(model, [(7, 7)] * 5)
    assert attention_calls == [5] * depth  # one call of 5 images per layer (the backward reuses its graph)
    attention_calls.clear()
    mixed = [(7, 7), (4, 6), (7, 7)]
    out, grads = _tower(model, mixed)
    assert attention_calls == [1] * (3 * depth)  # transformers' loop: one image a call
    ref_out, ref_grads = _tower(_per_image_copy(model), mixed)
    torch.testing.assert_close(out, ref_out)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name])
