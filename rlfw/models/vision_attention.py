"""One attention call per vision layer for a batch of equal-sized images.

transformers' Qwen3-VL vision tower packs every image's patches into one sequence, and outside
flash attention its attention splits that sequence per image and calls the kernel once per image:
64 maze images make 64 calls a layer, and twice as many in the backward pass. When the images all
have the same patch count (every batch of one env's observations), the split is a reshape: the
packed [1, heads, images x patches, dim] is [images, heads, patches, dim], and one batched call gives
the same attention. `pack_vision_attention` switches a loaded model's vision attention to that;
batches of mixed sizes, and flash attention (which takes the packed sequence as it is), keep
transformers' own path. On 2 CPU cores it made the main job's SFT step (64 maze states) 1.11x as
fast, 1.07x with sampling the states (experiments/bench/README.md, "Vision attention").
"""

from __future__ import annotations

import torch
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl


_HELPERS = ("is_flash_attention_requested", "apply_rotary_pos_emb_vision", "ALL_ATTENTION_FUNCTIONS",
            "eager_attention_forward")


class PackedVisionAttention(qwen3_vl.Qwen3VLVisionAttention):
    """Qwen3-VL's vision attention with the per-image loop as one batched call when the images are
    of one size; otherwise (or with flash attention) the parent's forward, unchanged."""

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                max_seqlen: int | None = None, **kwargs) -> torch.Tensor:
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # patches per image
        if qwen3_vl.is_flash_attention_requested(self.config) or bool((lengths != lengths[0]).any()):
            return super().forward(hidden_states, cu_seqlens, position_embeddings, max_seqlen, **kwargs)
        seq_len, n_images = hidden_states.shape[0], lengths.numel()
        q, k, v = self.qkv(hidden_states).reshape(seq_len, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        cos, sin = position_embeddings
        q, k = qwen3_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)  # [S, heads, dim]
        q, k, v = (t.reshape(n_images, seq_len // n_images, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = qwen3_vl.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                   qwen3_vl.eager_attention_forward)
        out, _ = attention(self, q, k, v, attention_mask=None, scaling=self.scaling,
                           dropout=0.0 if not self.training else self.attention_dropout, is_causal=False, **kwargs)
        return self.proj(out.reshape(seq_len, -1).contiguous())  # out: [images, patches, heads, dim]


def pack_vision_attention(model: torch.nn.Module) -> int:
    """Switch every Qwen3-VL vision attention module of `model` to `PackedVisionAttention` in place
    (same parameters, same state dict); return how many. Other models, and a transformers whose
    Qwen3-VL module lacks the helpers the batched call uses, are left as they are (0)."""
    if not all(hasattr(qwen3_vl, name) for name in _HELPERS):
        return 0
    return _swap_class(model, qwen3_vl.Qwen3VLVisionAttention, PackedVisionAttention)


def unpack_vision_attention(model: torch.nn.Module) -> int:
    """The inverse of `pack_vision_attention`: transformers' per-image loop again, in place; return
    how many modules changed. For checking and benchmarking the batched call against it."""
    return _swap_class(model, PackedVisionAttention, qwen3_vl.Qwen3VLVisionAttention)


def _swap_class(model: torch.nn.Module, old: type, new: type) -> int:
    modules = [m for m in model.modules() if type(m) is old]
    for module in modules:
        module.__class__ = new
    return len(modules)
