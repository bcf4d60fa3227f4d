"""The inference-engine interface, and its transformers implementation (CPU or GPU).

An engine generates for a batch of multimodal prompts given as token ids plus images, returns
generated ids with their log-probabilities, loads a new LoRA adapter (or full weights) from shared
storage after each training step, and can sleep while a colocated trainer uses the device. The
vLLM engine (the cluster backend, an optional extra; not built yet) is to implement the same protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from rlfw.models.processing import PolicyProcessor, collate
from rlfw.rollout.types import Completion, Prompt, SamplingParams


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
    """Batched `model.generate` over left-padded prompts, with the policy's log-probs."""

    def __init__(self, model: torch.nn.Module, processor: PolicyProcessor, max_batch_size: int = 64):
        self.model = model.eval()
        self.processor = processor
        self.max_batch_size = max_batch_size
        self.weights_version = 0

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        for start in range(0, len(prompts), self.max_batch_size):
            out.extend(self._generate_batch(prompts[start : start + self.max_batch_size], params))
        return out

    def _generate_batch(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        p = self.processor
        feats = [[p.image_features(img) for img in pr.images] for pr in prompts]
        batch = collate([pr.token_ids for pr in prompts], feats, p.image_token_id, p.pad_token_id, left_pad=True)
        sampling = {"do_sample": False} if params.greedy else {
            "do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        gen = self.model.generate(
            **batch, max_new_tokens=params.max_new_tokens, eos_token_id=p.eos_token_id, pad_token_id=p.pad_token_id,
            suppress_tokens=p.banned_token_ids, output_logits=True, return_dict_in_generate=True, **sampling,
        )
        new = gen.sequences[:, batch["input_ids"].shape[1]:]  # [B, G]
        # log-probs of the model's own distribution (raw logits / T), which is what the trainer computes
        # (rlfw.policy.sequence_logprobs at algo.temperature); banned structural tokens are never sampled
        temperature = 1.0 if params.greedy else params.temperature
        logits = torch.stack(gen.logits, dim=1).float() / temperature  # [B, G, V]
        logp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [B, G]
        completions = []
        for ids, lps in zip(new.tolist(), logp.tolist()):
            n = ids.index(p.eos_token_id) + 1 if p.eos_token_id in ids else len(ids)
            completions.append(Completion(ids[:n], lps[:n], finished=n <= len(ids) and ids[n - 1] == p.eos_token_id))
        return completions

    def load_weights(self, path: str) -> int:
        from rlfw.models.weights import load_policy_weights

        self.weights_version = load_policy_weights(self.model, Path(path))
        return self.weights_version

    def sleep(self) -> None:
        """Nothing to release for the transformers engine (it keeps no KV cache between calls)."""

    def wake_up(self) -> None:
        """Counterpart of sleep."""
