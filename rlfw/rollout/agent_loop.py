"""The multi-turn agent loop: many episodes at once, one batched engine call per turn.

Each turn the active episodes' conversations (the task prompt and current image, plus the whole
conversation so far when `history="full"`) go to the engine as one batch; the env parses each
reply; finished episodes drop out. Token ids are kept exactly as sampled (token in, token out), and
only model-generated tokens carry loss (`Segment.loss_mask`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np

from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.engine import InferenceEngine
from rlfw.rollout.types import Episode, Prompt, SamplingParams, Segment, Task


@dataclass
class LoopLimits:
    max_turns: int
    """Turns per episode (the env truncates at its own max_turns too)."""
    max_new_tokens: int
    """Tokens per turn."""
    max_episode_tokens: int
    """Prompt plus generated tokens per episode (history=full) or per turn (history=none)."""
    history: str = "none"
    """none or full (see rlfw.config.EnvConfig.history)."""


def turn_message(task_text: str, feedback: str) -> dict:
    """The user turn of history=none: the current image, the task prompt, last step's feedback."""
    text = task_text if not feedback else f"{task_text}\n{feedback}"
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}


class _Running:
    """Book-keeping of one episode in flight."""

    def __init__(self, episode: Episode, env: gym.Env, obs: dict, keep_frames: bool):
        self.episode, self.env = episode, env
        self.task_text = obs["text"]
        self.feedback = ""
        self.image = obs["image"]
        self.keep_frames = keep_frames
        self.ids: list[int] = []  # history=full: the whole conversation so far
        self.mask: list[int] = []
        self.logps: list[float] = []
        self.images: list[np.ndarray] = []
        if keep_frames:
            episode.frames.append(obs["image"])


def _turn_prompt(run: _Running, processor: PolicyProcessor, history: str) -> Prompt:
    features = [processor.image_features(run.image)]
    if history == "full":
        if run.ids:  # close the previous assistant turn
            run.ids += processor.turn_end_ids
            run.mask += [0] * len(processor.turn_end_ids)
            run.logps += [0.0] * len(processor.turn_end_ids)
        text = run.feedback or run.task_text
        msg = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}
        new = processor.encode_message(msg, features) + processor.generation_prompt_ids
        run.ids += new
        run.mask += [0] * len(new)
        run.logps += [0.0] * len(new)
        run.images.append(run.image)
        return Prompt(list(run.ids), list(run.images))
    ids = processor.encode_message(turn_message(run.task_text, run.feedback), features) + processor.generation_prompt_ids
    return Prompt(ids, [run.image])


def collect(
    engine: InferenceEngine,
    processor: PolicyProcessor,
    envs: list[gym.Env],
    tasks: list[Task],
    n_samples: int,
    params: SamplingParams,
    limits: LoopLimits,
    keep_frames: bool = False,
    on_turn: Callable[[int, int], None] | None = None,
    timers: dict[str, float] | None = None,
) -> list[Episode]:
    """Run `n_samples` episodes of every task to the end; episode i uses envs[i].

    `timers`, if given, accumulates seconds spent in `generate` (engine) and `env` (step + prompts).
    """
    timers = timers if timers is not None else {}
    timers.setdefault("generate", 0.0)
    timers.setdefault("env", 0.0)
    n = len(tasks) * n_samples
    if len(envs) < n:
        raise ValueError(f"collect needs {n} envs, got {len(envs)}")
    running: list[_Running] = []
    for i in range(n):
        task = tasks[i // n_samples]
        obs, _ = envs[i].reset(**task.reset_kwargs())
        running.append(_Running(Episode(task=task, group_id=i // n_samples), envs[i], obs, keep_frames))

    active = list(running)
    for turn in range(limits.max_turns):
        prompts = [_turn_prompt(r, processor, limits.history) for r in active]
        fits = [len(p.token_ids) + limits.max_new_tokens <= limits.max_episode_tokens for p in prompts]
        for r, ok in zip(active, fits):
            r.episode.truncated_by_tokens = not ok
        active = [r for r, ok in zip(active, fits) if ok]
        prompts = [p for p, ok in zip(prompts, fits) if ok]
        if not active:
            break
        t0 = time.perf_counter()
        completions = engine.generate(prompts, params)
        t1 = time.perf_counter()
        timers["generate"] += t1 - t0
        still: list[_Running] = []
        for r, prompt, comp in zip(active, prompts, completions):
            ep = r.episode
            if limits.history == "full":
                r.ids += comp.token_ids
                r.mask += [1] * len(comp.token_ids)
                r.logps += comp.logprobs
                if not comp.finished:  # close the turn; the appended EOS is not the model's
                    r.ids.append(processor.eos_token_id)
                    r.mask.append(0)
                    r.logps.append(0.0)
            else:
                ep.segments.append(Segment(
                    token_ids=prompt.token_ids + comp.token_ids,
                    loss_mask=[0] * len(prompt.token_ids) + [1] * len(comp.token_ids),
                    logprobs=[0.0] * len(prompt.token_ids) + comp.logprobs,
                    images=prompt.images,
                ))
            text = processor.decode(comp.token_ids)
            obs, reward, terminated, truncated, info = r.env.step(text)
            ep.actions.append(text)
            ep.turns += 1
            ep.reward += float(reward)
            ep.success = bool(info.get("success", False))
            ep.invalid_actions += int(bool(info.get("invalid_action", False)))
            ep.wall_bumps += int(bool(info.get("wall_bump", False)))
            ep.generated_tokens += len(comp.token_ids)
            r.image, r.feedback = obs["image"], obs["text"]
            if keep_frames:
                ep.frames.append(obs["image"])
            if not (terminated or truncated):
                still.append(r)
        active = still
        timers["env"] += time.perf_counter() - t1
        if on_turn is not None:
            on_turn(turn, len(active))
        if not active:
            break

    episodes = []
    for r in running:
        if limits.history == "full" and r.ids:
            r.episode.segments = [Segment(r.ids, r.mask, r.logps, r.images)]
            # drop the trailing prompt of a turn that never ran (token limit)
            last = max(i for i, m in enumerate(r.mask) if m) if any(r.mask) else -1
            seg = r.episode.segments[0]
            seg.token_ids, seg.loss_mask, seg.logprobs = seg.token_ids[: last + 1], seg.loss_mask[: last + 1], seg.logprobs[: last + 1]
            n_img = sum(1 for t in seg.token_ids if t == processor.image_token_id)
            per = processor.image_features(r.images[0]).n_tokens if r.images else 1
            seg.images = r.images[: n_img // per]
        episodes.append(r.episode)
    return episodes
