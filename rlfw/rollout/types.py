"""Typed containers that cross the rollout boundary (engine requests, completions, episodes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 1.0
    """Softmax temperature; ignored when greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 8
    """Generation limit for this request."""
    greedy: bool = False
    """Argmax decoding (evaluation)."""


@dataclass
class Prompt:
    """One generation request: ids already contain each image's placeholder tokens."""

    token_ids: list[int]  # [T]
    images: list[np.ndarray]  # each uint8 [H, W, 3], in placeholder order
    sample_key: tuple[int, ...] = ()
    """Names this request's random draws: an engine seeded with s samples a request from
    (s, sample_key) alone, whatever else is in the batch and however many engines share it. The agent
    loop sets (episode index, turn); without a key an engine numbers its requests itself."""
    messages: Optional[list[dict]] = None
    """The same request as chat messages (image parts stand for `images`, in order), for engines that
    take messages rather than ids (`rlfw.rollout.openai_engine`); set by the agent loop."""


_M64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def sample_seed(seed: int, key: tuple[int, ...]) -> int:
    """A 63-bit seed for one request's draws, from the engine's seed and the request's key (a
    splitmix64 chain: cheap enough to run per request, and no two nearby keys share a stream)."""
    h = _splitmix64(seed & _M64)
    for k in key:
        h = _splitmix64(h ^ (k & _M64))
    return h >> 1


@dataclass
class Completion:
    token_ids: list[int]  # [G] generated ids, ending with EOS unless cut by max_new_tokens
    logprobs: list[float]  # [G] log-prob of each generated id under the sampling policy (T applied)
    finished: bool  # ended with EOS


@dataclass
class Task:
    """What a group of episodes starts from: a generator seed, or a saved layout to replay."""

    seed: int
    layout: Optional[dict[str, Any]] = None
    feedback: str = ""
    """The feedback text the first turn sees (a restart mid-episode, `rlfw.rollout.restarts`:
    the previous turn's feedback); empty for a fresh start."""
    max_turns: Optional[int] = None
    """Turns this task's episodes get, if fewer than the loop's limit (a restart: the original
    episode's remaining turns); None for the loop's limit."""

    def reset_kwargs(self) -> dict[str, Any]:
        if self.layout is not None:
            return {"seed": self.seed, "options": {"layout": self.layout}}
        return {"seed": self.seed}


@dataclass
class Segment:
    """One training sequence: a whole conversation (history=full) or one turn (history=none)."""

    token_ids: list[int]  # [T]
    loss_mask: list[int]  # [T] 1 on model-generated tokens, 0 on prompt/observation tokens
    logprobs: list[float]  # [T] engine log-probs on generated tokens, 0 elsewhere
    images: list[np.ndarray]  # images whose placeholders appear in token_ids, in order


@dataclass
class Episode:
    task: Task
    group_id: int  # episodes of one task share a group id (the GRPO group)
    segments: list[Segment] = field(default_factory=list)
    reward: float = 0.0  # sum of env rewards
    success: bool = False  # the env's own info["success"] at the end, never inferred from reward
    turns: int = 0
    invalid_actions: int = 0
    wall_bumps: int = 0
    generated_tokens: int = 0
    truncated_by_tokens: bool = False
    actions: list[str] = field(default_factory=list)  # decoded model outputs, one per turn
    oracle_actions: list[Optional[str]] = field(default_factory=list)
    """[turns] the env's `best_action()` at the state each turn's prompt showed (before the step);
    None where the env has no oracle."""
    parsed_actions: list[Optional[str]] = field(default_factory=list)
    """[turns] the action the env parsed from each reply (its `info["action"]`, canonical string;
    None for an invalid reply or an env that does not report it)."""
    state_tags: list[Optional[str]] = field(default_factory=list)
    """[turns] the env's `state_tag()` at the state each turn's prompt showed, recorded with
    `oracle_actions` (the mazes: junction or corridor); None where the env has none."""
    frames: list[np.ndarray] = field(default_factory=list)  # observation images (kept when asked)


@dataclass
class TrainBatch:
    """A step's training data: every segment with its episode's advantage and task group."""

    segments: list[Segment]  # [N]
    advantages: list[float]  # [N] the episode's advantage, repeated for each of its segments
    groups: list[int]  # [N] task group (mini-batches are cut at group boundaries)
    oracle: list[Segment] = field(default_factory=list)
    """[K] oracle-labelled turns (`algo.oracle_coef`, `rlfw.rollout.oracle`): the turn's prompt,
    then the oracle's action and EOS as loss tokens; empty when the term is off."""
    oracle_groups: list[int] = field(default_factory=list)
    """[K] the task group of each oracle segment (it joins that group's mini-batch)."""
    oracle_weights: list[float] = field(default_factory=list)
    """[K] each oracle segment's weight in the term's weighted token mean (`algo.oracle_tag_weights`);
    empty: all 1."""


def image_digest(image: np.ndarray) -> bytes:
    """A short fingerprint of an image's pixels, to recognise identical observations."""
    return hashlib.sha1(np.ascontiguousarray(image).tobytes()).digest()


def segment_key(s: Segment) -> tuple:
    """Identity of a training sequence: its tokens, loss mask and images."""
    return tuple(s.token_ids), tuple(s.loss_mask), tuple(image_digest(im) for im in s.images)


def prompt_key(p: Prompt) -> tuple:
    """Identity of a generation request: its tokens and images."""
    return tuple(p.token_ids), tuple(image_digest(im) for im in p.images)
