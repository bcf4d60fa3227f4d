"""The language model's last layer only at the positions whose logits a loss reads.

A training forward (`rlfw.policy.sequence_logprobs`) needs logits at a few positions a sequence: the
tokens the policy generated (one action and `<|im_end|>` in a maze turn of about 98 tokens). Every
layer but the last must still run at every position, since the last layer's keys and values come
from all of them. The last layer itself only matters at the kept positions: its keys and values at
every position (two small projections), but its query, attention output, output projection and MLP
at the kept ones alone. `LastLayerAtQueries` computes exactly that when the forward passes
`query_positions` ([B, Q] distinct positions a row, the kept ones among them); the other rows of its
output are its input, unused (only the kept rows reach the LM head). Without `query_positions`,
with a KV cache (generation), with flash attention or without a materialized attention mask it is
transformers' own layer. On 2 CPU cores it made the main job's SFT step (64 maze states) 1.16x as
fast (experiments/bench/README.md, "The last layer at the kept positions").
"""

from __future__ import annotations

import torch
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

_HELPERS = ("is_flash_attention_requested", "rotate_half", "ALL_ATTENTION_FUNCTIONS", "eager_attention_forward")


class LastLayerAtQueries(qwen3_vl.Qwen3VLTextDecoderLayer):
    """Qwen3-VL's text decoder layer, run for the queries at `query_positions` only (see the module)."""

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, position_ids: torch.LongTensor | None = None,
                cache=None, use_cache: bool | None = False, query_positions: torch.Tensor | None = None,
                **kwargs) -> torch.Tensor:
        attn = self.self_attn
        if (query_positions is None or cache is not None or attention_mask is None or attention_mask.ndim != 4
                or qwen3_vl.is_flash_attention_requested(attn.config)):
            return super().forward(hidden_states, position_embeddings, attention_mask=attention_mask,
                                   position_ids=position_ids, cache=cache, use_cache=use_cache, **kwargs)
        batch, length, width = hidden_states.shape
        n_queries, head_dim = query_positions.shape[1], attn.head_dim

        def at_queries(t: torch.Tensor) -> torch.Tensor:  # [B, T, ...] -> [B, Q, ...]
            index = query_positions.reshape(batch, n_queries, *([1] * (t.dim() - 2)))
            return torch.take_along_dim(t, index, dim=1)

        normed = self.input_layernorm(hidden_states)
        query = attn.q_norm(attn.q_proj(at_queries(normed)).view(batch, n_queries, -1, head_dim)).transpose(1, 2)
        key = attn.k_norm(attn.k_proj(normed).view(batch, length, -1, head_dim)).transpose(1, 2)
        value = attn.v_proj(normed).view(batch, length, -1, head_dim).transpose(1, 2)
        cos, sin = position_embeddings  # [B, T, head_dim]
        key = key * cos.unsqueeze(1) + qwen3_vl.rotate_half(key) * sin.unsqueeze(1)
        q_cos, q_sin = at_queries(cos).unsqueeze(1), at_queries(sin).unsqueeze(1)
        query = query * q_cos + qwen3_vl.rotate_half(query) * q_sin
        mask = attention_mask.expand(batch, -1, -1, -1)  # [B, 1, T, T]: the query rows
        mask = torch.take_along_dim(mask, query_positions[:, None, :, None], dim=2)
        attention = qwen3_vl.ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                                   qwen3_vl.eager_attention_forward)
        out, _ = attention(attn, query, key, value, mask, scaling=attn.scaling,
                           dropout=0.0 if not self.training else attn.attention_dropout, **kwargs)
        rows = at_queries(hidden_states) + attn.o_proj(out.reshape(batch, n_queries, -1))
        rows = rows + self.mlp(self.post_attention_layernorm(rows))
        return hidden_states.scatter(1, query_positions[..., None].expand(-1, -1, width), rows)


def query_positions(keep: torch.Tensor) -> torch.Tensor:
    """[B, Q] distinct positions a row, Q the most kept positions of any row: each row's kept
    positions (keep [B, T], bool) first, in order, then unkept ones to fill the row. Distinct, so
    the scatter that writes the layer's rows back has one writer a position (and an exact gradient)."""
    length = keep.shape[1]
    n = int(keep.sum(1).max())
    rank = (~keep).long() * length + torch.arange(length, device=keep.device)  # kept ones first
    return rank.argsort(dim=1)[:, :n]


def layer_kwargs(model: torch.nn.Module, keep: torch.Tensor) -> dict:
    """The forward kwargs that run `model`'s last layer at the kept positions only: {} for a model
    without `LastLayerAtQueries` (it would not take the argument; FSDP2's wrapped layer subclasses
    it) and when nothing is kept."""
    if not keep.any() or not any(isinstance(m, LastLayerAtQueries) for m in model.modules()):
        return {}
    return {"query_positions": query_positions(keep)}


def trim_last_layer(model: torch.nn.Module) -> int:
    """Switch the last text decoder layer of `model` (Qwen3-VL) to `LastLayerAtQueries` in place (same
    parameters, same state dict); return how many layers changed (1, or 0 for other models and a
    transformers without the helpers it uses)."""
    if not all(hasattr(qwen3_vl, name) for name in _HELPERS):
        return 0
    layers = [m for m in model.modules() if isinstance(m, qwen3_vl.Qwen3VLTextDecoderLayer)]
    if not layers or type(layers[-1]) is not qwen3_vl.Qwen3VLTextDecoderLayer:
        return 0
    layers[-1].__class__ = LastLayerAtQueries
    return 1


def untrim_last_layer(model: torch.nn.Module) -> int:
    """The inverse of `trim_last_layer`: transformers' layer again; return how many changed."""
    layers = [m for m in model.modules() if type(m) is LastLayerAtQueries]
    for layer in layers:
        layer.__class__ = qwen3_vl.Qwen3VLTextDecoderLayer
    return len(layers)
