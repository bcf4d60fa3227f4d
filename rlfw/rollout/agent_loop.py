"""The multi-turn agent loop: many episodes at once, one batched engine call per turn.

Each turn the active episodes' conversations (the task prompt and current image, plus the whole
conversation so far when `history="full"`) go to the engine as one batch; the env parses each
reply; finished episodes drop out. Token ids are kept exactly as sampled (token in, token out), and
only model-generated tokens carry loss (`Segment.loss_mask`).

Where the env has an oracle (`best_action()`), every turn also records the oracle's action at the
state that turn's prompt showed, before the env steps, beside the action the env parsed from the
reply (`Episode.oracle_actions`, `Episode.parsed_actions`): the labels of `rlfw.rollout.oracle` and
the first wrong moves of `rlfw.rollout.restarts`; where the env names it, the kind of state too
(`state_tag()`, `Episode.state_tags`). A task may start mid-episode (`Task.feedback`)
and with fewer turns than the loop's limit (`Task.max_turns`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
import gymnasium as gym

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
    oracle: bool = True
    """Record the env's best_action() at every turn (`Episode.oracle_actions`), where the env has one:
    a shortest-path search per turn, so training turns it off unless a lever reads the labels."""


def turn_message(task_text: str, feedback: str) -> dict:
    """The user turn of history=none: the current image, the task prompt, last step's feedback."""
    text = task_text if not feedback else f"{task_text}\n{feedback}"
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}


class _Running:
    """Book-keeping of one episode in flight."""

    def __init__(self, episode: Episode, env: gym.Env, obs: dict, max_turns: int):
        self.episode, self.env = episode, env
        self.task_text = obs["text"]
        self.feedback = episode.task.feedback
        self.image = obs["image"]
        self.oracle = getattr(env.unwrapped, "best_action", None)  # None: an env without an oracle
        self.tag = getattr(env.unwrapped, "state_tag", None)
        self.max_turns = min(max_turns, episode.task.max_turns or max_turns)
        self.conversation: Segment | None = None  # history=full: everything so far, as sampled
        self.messages: list[dict] = []  # history=full: the conversation as chat messages (for endpoints)
        self.open_turn = False  # history=full: the last reply was cut before its EOS


def _turn_prompt(run: _Running, processor: PolicyProcessor, history: str) -> tuple[Prompt, list[int]]:
    """The prompt for this turn, and (history=full) the ids it adds to the conversation."""
    images = [run.image]
    if history == "none":
        message = turn_message(run.task_text, run.feedback)
        ids = processor.encode_message(message, images)
        return Prompt(ids + processor.generation_prompt_ids, [run.image], messages=[message]), []
    conv = run.conversation
    new = ([processor.eos_token_id] if run.open_turn else []) + (processor.turn_end_ids if conv else [])
    text = run.feedback or run.task_text
    msg = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}
    new += processor.encode_message(msg, images) + processor.generation_prompt_ids
    previous = conv.token_ids if conv else []
    return Prompt(previous + new, (conv.images if conv else []) + [run.image], messages=[*run.messages, msg]), new


def _record(run: _Running, prompt: Prompt, added: list[int], comp, history: str) -> None:
    """Append this turn's tokens to the episode's training segments."""
    n = len(comp.token_ids)
    if history == "none":
        p = len(prompt.token_ids)
        run.episode.segments.append(Segment(prompt.token_ids + comp.token_ids, [0] * p + [1] * n,
                                            [0.0] * p + comp.logprobs, prompt.images))
        return
    if run.conversation is None:
        run.conversation = Segment([], [], [], [])
        run.episode.segments.append(run.conversation)
    conv = run.conversation
    conv.token_ids += added + comp.token_ids
    conv.loss_mask += [0] * len(added) + [1] * n
    conv.logprobs += [0.0] * len(added) + comp.logprobs
    conv.images.append(run.image)
    run.open_turn = not comp.finished


def collect(
    engine: InferenceEngine,
    processor: PolicyProcessor,
    envs: list[gym.Env],
    tasks: list[Task],
    n_samples: int,
    params: SamplingParams,
    limits: LoopLimits,
    keep_frames: bool = False,
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
        episode = Episode(task=task, group_id=i // n_samples, frames=[obs["image"]] if keep_frames else [])
        running.append(_Running(episode, envs[i], obs, limits.max_turns))

    active = list(running)
    index = {id(r): i for i, r in enumerate(running)}
    for turn in range(limits.max_turns):
        t0 = time.perf_counter()
        turns = [(r, *_turn_prompt(r, processor, limits.history)) for r in active]
        for r, prompt, _ in turns:  # the engine draws this turn's sample from (its seed, episode, turn)
            prompt.sample_key = (index[id(r)], turn)
        for r, prompt, _ in turns:  # per-episode token limit: stop before a turn that cannot fit
            r.episode.truncated_by_tokens = len(prompt.token_ids) + limits.max_new_tokens > limits.max_episode_tokens
        turns = [t for t in turns if not t[0].episode.truncated_by_tokens]
        if not turns:
            break
        t1 = time.perf_counter()
        completions = engine.generate([prompt for _, prompt, _ in turns], params)
        t2 = time.perf_counter()
        still: list[_Running] = []
        for (r, prompt, added), comp in zip(turns, completions):
            _record(r, prompt, added, comp, limits.history)
            text = processor.decode(comp.token_ids)
            if limits.history == "full":
                r.messages += [prompt.messages[-1], {"role": "assistant", "content": text}]
            ep = r.episode
            ep.oracle_actions.append(r.oracle() if r.oracle and limits.oracle else None)  # at the state this prompt showed
            ep.state_tags.append(r.tag() if r.tag and limits.oracle else None)
            obs, reward, terminated, truncated, info = r.env.step(text)
            ep.parsed_actions.append(info.get("action"))
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
            if not (terminated or truncated) and ep.turns < r.max_turns:
                still.append(r)
        active = still
        timers["generate"] += t2 - t1
        timers["env"] += (t1 - t0) + (time.perf_counter() - t2)
        if not active:
            break
    return [r.episode for r in running]
