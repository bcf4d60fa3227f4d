"""The inference-engine interface, and its transformers implementation (CPU or GPU).

An engine generates for a batch of multimodal prompts given as token ids plus images, returns
generated ids with their log-probabilities, loads a new LoRA adapter (or full weights) from shared
storage after each training step, and can sleep while a colocated trainer uses the device. The
vLLM engine (`rlfw.rollout.vllm_engine`, chosen by `cluster.engine_backend`) implements the same protocol.
The transformers engine runs on the CPU or on a CUDA device (`device`, from `cluster.gpus_per_worker`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from rlfw.models.processing import PolicyProcessor, collate
from rlfw.rollout.types import Completion, Prompt, SamplingParams, prompt_key, sample_seed


class EngineFailure(RuntimeError):
    """A rollout engine died mid-call; the runtime has restarted it (see `recover`)."""


class InferenceEngine(Protocol):
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]: ...

    def load_weights(self, path: str) -> int:
        """Load the adapter (or full weights) saved at `path`; return the version written there."""
        ...

    def set_seed(self, seed: int) -> None:
        """Seed sampling, so a step's rollouts are a function of (seed, weights)."""
        ...

    def recover(self, sync_root: str) -> None:
        """After an EngineFailure: wait for restarted engines and reload the published weights."""
        ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


class TransformersEngine:
    """Batched prefill and decode over left-padded prompts, with the policy's log-probs.

    Identical prompts (same tokens and images: the members of a GRPO group at their first turn, and
    a memoryless policy's revisited states) are prefilled once; their KV cache rows are then copied,
    and each copy samples its own reply. Decoding is a plain loop over the model with its KV cache,
    a few steps per turn (each action is one token, then `<|im_end|>`).
    """

    def __init__(self, model: torch.nn.Module, processor: PolicyProcessor, max_batch_size: int = 64,
                 device: str = "cpu", merge_lora: bool = True, autocast: str | None = None):
        from rlfw.models import resolve_train_autocast

        self.model = model.to(device).eval()
        self.device = torch.device(device)
        # model.engine_autocast: the forward passes in bf16, sampling in float32 over their logits
        self.autocast = resolve_train_autocast(autocast, self.device, key="model.engine_autocast")
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.weights_version = 0
        self.seed, self._calls = 0, 0  # unkeyed requests are numbered (call, position) since set_seed
        self.stats = {"prompts": 0, "prefilled": 0}  # the prefix sharing at work, for benchmarks
        # A LoRA adapter is merged into the base weights for inference (no extra matmuls per layer);
        # loading new weights unmerges the old adapter first. merge_lora=False serves a model that is
        # also being trained (SFT's evaluation): PEFT's merged forward bypasses the adapter, so a
        # merged model would get no gradient into it.
        self.lora = merge_lora and hasattr(model, "peft_config")
        if self.lora:
            # pristine base weights of the adapted layers: unmerging subtracts in floating point, so
            # each load restores them exactly and the merged weights never depend on the history
            self._base = {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer" in n}
            self.model.merge_adapter()

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        self._calls += 1
        for start in range(0, len(prompts), self.max_batch_size):
            out.extend(self._generate_batch(prompts[start : start + self.max_batch_size], params, start))
        return out

    def _generate_batch(self, prompts: list[Prompt], params: SamplingParams, offset: int = 0) -> list[Completion]:
        p = self.processor
        # one prefill row per distinct prompt; `rows[i]` is prompt i's row
        row_of: dict[tuple, int] = {}
        unique: list[Prompt] = []
        rows = []
        for pr in prompts:
            key = prompt_key(pr)
            if key not in row_of:
                row_of[key] = len(unique)
                unique.append(pr)
            rows.append(row_of[key])
        self.stats["prompts"] += len(prompts)
        self.stats["prefilled"] += len(unique)
        feats = [[p.image_features(img) for img in pr.images] for pr in unique]
        batch = collate([pr.token_ids for pr in unique], feats, p.image_token_id, p.pad_token_id, left_pad=True)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        inner = self._inner()
        inner.rope_deltas = None  # set by this prefill when it has images
        if "pixel_values" not in batch:  # text only: positions count real tokens, not left padding
            pos = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            batch["position_ids"] = pos.unsqueeze(0).expand(3, -1, -1)
        with self._autocast():
            out = self.model(**batch, use_cache=True)
        cache = out.cache
        index = torch.tensor(rows, device=self.device)
        cache.reorder_cache(index)  # copy each distinct prompt's KV rows to all of its samples
        logits = out.logits[index, -1].float()  # [B, V]
        attention = batch["attention_mask"][index]  # [B, L]
        # decode positions continue the prompt's multimodal RoPE positions, as in a full forward pass
        deltas = (inner.rope_deltas[index] if inner.rope_deltas is not None
                  else torch.zeros(len(rows), 1, dtype=torch.long, device=self.device))
        next_pos = attention.sum(-1, keepdim=True) + deltas  # [B, 1]

        temperature = 1.0 if params.greedy else params.temperature
        dev = self.device
        banned = torch.tensor(p.banned_token_ids, dtype=torch.long, device=dev)
        n = len(prompts)
        ids = torch.full((n, params.max_new_tokens), p.pad_token_id, dtype=torch.long, device=dev)
        logps = torch.zeros(n, params.max_new_tokens, device=dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        generators = None if params.greedy else [self._generator(pr, offset + i) for i, pr in enumerate(prompts)]
        for t in range(params.max_new_tokens):
            # log-probs of the model's own distribution (raw logits / T), which is what the trainer
            # computes (rlfw.policy.sequence_logprobs at algo.temperature); banned tokens are never sampled
            scaled = logits / temperature
            logp_all = torch.log_softmax(scaled, -1)
            token = _sample(scaled, banned, params, generators)
            token = torch.where(done, torch.full_like(token, p.pad_token_id), token)
            ids[:, t] = token
            logps[:, t] = logp_all.gather(-1, token[:, None]).squeeze(-1)
            done |= token == p.eos_token_id
            if bool(done.all()) or t + 1 == params.max_new_tokens:
                break
            attention = torch.cat([attention, torch.ones(n, 1, dtype=attention.dtype, device=dev)], dim=1)
            pos = (next_pos + t).unsqueeze(0).expand(3, -1, -1)  # [3, B, 1]
            with self._autocast():
                out = self.model(input_ids=token[:, None], attention_mask=attention, position_ids=pos,
                                 cache=cache, use_cache=True)
            cache = out.cache
            logits = out.logits[:, -1].float()

        completions = []
        for row_ids, row_lps in zip(ids.tolist(), logps.tolist()):
            k = row_ids.index(p.eos_token_id) + 1 if p.eos_token_id in row_ids else len(row_ids)
            k = min(k, t + 1)
            completions.append(Completion(row_ids[:k], row_lps[:k], finished=row_ids[k - 1] == p.eos_token_id))
        return completions

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast is not None)

    def _inner(self):
        """The Qwen-VL backbone that holds `rope_deltas` (under PEFT's wrappers when LoRA is on)."""
        m = self.model
        while not hasattr(m, "rope_deltas"):
            m = m.get_base_model() if hasattr(m, "get_base_model") else m.model
        return m

    def load_weights(self, path: str) -> int:
        from rlfw.models.weights import load_policy_weights

        if self.lora:
            self.model.unmerge_adapter()
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, weight in self._base.items():
                    params[name].copy_(weight)
        try:
            self.weights_version = load_policy_weights(self.model, Path(path))
        finally:
            if self.lora:
                self.model.merge_adapter()
        return self.weights_version

    def set_seed(self, seed: int) -> None:
        """Each request then samples from its own generator, seeded from (seed, the request's
        `sample_key`), so its draws do not depend on the batch it shares or on how many engines do."""
        self.seed, self._calls = seed, 0

    def _generator(self, prompt: Prompt, position: int) -> torch.Generator:
        key = (1, *prompt.sample_key) if prompt.sample_key else (0, self._calls, position)
        return torch.Generator().manual_seed(sample_seed(self.seed, key))

    def sleep(self) -> None:
        """Nothing to release for the transformers engine (it keeps no KV cache between calls)."""

    def wake_up(self) -> None:
        """Counterpart of sleep."""


def _sample(logits: torch.Tensor, banned: torch.Tensor, params: SamplingParams,
            generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """Greedy or (nucleus) sampling from temperature-scaled logits [B, V], never a banned token.

    Sampling is the Gumbel-max trick with row b's uniforms drawn from generators[b] (one per
    request), an exact draw from softmax(logits) restricted to the nucleus."""
    logits = logits.index_fill(-1, banned, float("-inf"))
    if params.greedy:
        return logits.argmax(-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.softmax(logits, -1).sort(-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # beyond the smallest set reaching top_p
        logits = logits.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside), float("-inf"))
    assert generators is not None and len(generators) == len(logits)
    u = torch.stack([torch.rand(logits.shape[-1], generator=g) for g in generators])
    gumbel = -torch.log(-torch.log(u.clamp(min=1e-30)))  # [B, V]; the clamp keeps u = 0 finite
    return (logits + gumbel.to(logits.device)).argmax(-1)
