"""An OpenAI-compatible chat endpoint as an `InferenceEngine`: evaluate a served policy
(`python -m rlfw.eval eval.base_url=http://127.0.0.1:8000/v1 eval.model=<base>:<adapter>`).

Each request is the turn's chat messages (`Prompt.messages`, set by the agent loop) with its images
as PNG data URLs, exactly the pixels the in-process engines read (the env crops them,
`envs.wrappers.CropImage`). The server applies the model's own chat template; for rlfw's policies it
renders the ids rlfw's processor builds, so a served policy plays the episodes the in-process one
plays. Greedy requests are temperature 0; sampled ones carry a seed drawn from (engine seed,
`Prompt.sample_key`), as the in-process engines do, so a batch's draws do not depend on the others.

What an endpoint cannot give: the sampled tokens themselves (the reply is text, re-encoded with the
policy's tokenizer) and their log-probs (zeros). That is enough for evaluation, not for training.
"""

from __future__ import annotations

import base64
import io
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.engine import EngineFailure
from rlfw.rollout.types import Completion, Prompt, SamplingParams, sample_seed


def image_url(image: np.ndarray) -> str:
    """A PNG data URL of an HxWx3 uint8 image (lossless: the server decodes the same pixels)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def openai_messages(prompt: Prompt) -> list[dict]:
    """`prompt.messages` in the OpenAI chat format: each image part becomes an image_url part holding
    the next of `prompt.images`."""
    if prompt.messages is None:
        raise ValueError("this prompt has no chat messages (Prompt.messages): an endpoint needs them; "
                         "prompts from rlfw.rollout.agent_loop carry them")
    images = iter(prompt.images)
    out = []
    for m in prompt.messages:
        content = m["content"]
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        parts = []
        for part in content:
            if part["type"] == "image":
                parts.append({"type": "image_url", "image_url": {"url": image_url(next(images))}})
            else:
                parts.append(part)
        out.append({"role": m["role"], "content": parts})
    return out


class OpenAIEngine:
    """`InferenceEngine` over an OpenAI-compatible `/v1/chat/completions`, `concurrency` requests in flight."""

    def __init__(self, base_url: str, model: str, processor: PolicyProcessor, concurrency: int = 8,
                 api_key: str | None = None, timeout_s: float = 120.0, max_retries: int = 2):
        import logging

        from openai import OpenAI

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
        self.model, self.processor = model, processor
        self.client = OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=max_retries)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="rlfw-openai")
        self.seed, self._calls = 0, 0
        self.weights_version = 0
        self.stats = {"requests": 0, "seconds": 0.0}

    def _one(self, prompt: Prompt, params: SamplingParams, position: int) -> Completion:
        import openai

        extra = {}
        if not params.greedy:
            key = (1, *prompt.sample_key) if prompt.sample_key else (0, self._calls, position)
            extra = {"seed": sample_seed(self.seed, key) % 2**31, "top_p": params.top_p}
        try:
            reply = self.client.chat.completions.create(
                model=self.model, messages=openai_messages(prompt), max_tokens=params.max_new_tokens,
                temperature=0.0 if params.greedy else params.temperature, n=1, **extra)
        except openai.APIStatusError as exc:  # the server answered: a bad request, unknown model, ...
            raise ValueError(f"{self.client.base_url} refused a request for model {self.model!r}: "
                             f"HTTP {exc.status_code}: {exc.message}") from exc
        except openai.APIConnectionError as exc:
            raise EngineFailure(f"the endpoint {self.client.base_url} is unreachable: {exc}") from exc
        choice = reply.choices[0]
        text = choice.message.content or ""
        finished = choice.finish_reason == "stop"
        ids = self.processor.tokenizer.encode(text, add_special_tokens=False)
        ids += [self.processor.eos_token_id] if finished else []
        return Completion(ids, [0.0] * len(ids), finished=finished)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        self._calls += 1
        t0 = time.perf_counter()
        out = list(self.pool.map(lambda a: self._one(*a), [(p, params, i) for i, p in enumerate(prompts)]))
        self.stats["requests"] += len(prompts)
        self.stats["seconds"] += time.perf_counter() - t0
        return out

    def set_seed(self, seed: int) -> None:
        self.seed, self._calls = seed, 0

    def load_weights(self, path: str) -> int:
        raise NotImplementedError("an endpoint serves its own weights: publish an adapter where the server "
                                  "loads adapters from (python -m rlfw.serve), and request it by name")

    def recover(self, sync_root: str) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def peak_rss_mb(self) -> list[float]:
        return [0.0]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
