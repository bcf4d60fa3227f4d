"""A tiny maze setup and an engine that plays a scripted policy against the oracle, for the tests of
the oracle term and restarts: which moves agree with the oracle is chosen by the test, not sampled."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from envs.actions import DELTAS, STOP
from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import EnvConfig, LoraConfig, ModelConfig, TinyVLSpec
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.types import Completion, Episode, SamplingParams, Task

MAX_TURNS = 6
ENV = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=MAX_TURNS, kwargs={"cell_px": 8})
MODEL = ModelConfig(name="tiny_vl", tiny=TinyVLSpec(hidden_size=64, num_layers=1, intermediate_size=128,
                                                     vision_depth=1), lora=LoraConfig(rank=4, alpha=8))
LIMITS = LoopLimits(max_turns=MAX_TURNS, max_new_tokens=8, max_episode_tokens=4096)


def build(tmp: Path) -> tuple[str, PolicyProcessor, Callable]:
    path = prepare_base_model(MODEL, make_env_fn(ENV), tmp, seed=0)
    processor = PolicyProcessor.from_pretrained(path)
    return path, processor, make_env_fn(ENV, processor.crop_px)


def other_open_move(env) -> str:
    """A move that is not the oracle's: into an open neighbour if there is one, else into a wall
    (a dead end whose only way out is the oracle's)."""
    u = env.unwrapped
    record, oracle = u.layout(), u.best_action()
    r, c = record["agent"]
    moves = [u.action_strings[i] for i in range(len(DELTAS)) if u.action_strings[i] != oracle]
    open_ = [a for a, (dr, dc) in zip(u.action_strings, DELTAS) if a in moves and record["grid"][r + dr][c + dc] == "."]
    return (open_ or moves)[0]


class ScriptedEngine:
    """Plays `plan(episode, turn, env)` -> action string for episode i on envs[i], at the state the
    prompt shows (the agent loop calls generate before it steps the envs)."""

    def __init__(self, processor: PolicyProcessor, envs: list, plan: Callable[[int, int, object], str]):
        self.processor, self.envs, self.plan = processor, envs, plan

    def set_seed(self, seed: int) -> None:
        pass

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            episode, turn = p.sample_key
            ids = self.processor.tokenizer.encode(self.plan(episode, turn, self.envs[episode]),
                                                  add_special_tokens=False) + [self.processor.eos_token_id]
            out.append(Completion(ids, [-0.5] * len(ids), True))
        return out


def first_wrong_at(wrong_turn: Callable[[int], int]) -> Callable[[int, int, object], str]:
    """Episode i follows the oracle (never stopping) before turn wrong_turn(i), then leaves its square
    the wrong way; after that, the oracle again."""
    def plan(episode: int, turn: int, env) -> str:
        if turn == wrong_turn(episode):
            return other_open_move(env)
        oracle = env.unwrapped.best_action()
        return other_open_move(env) if oracle == env.unwrapped.action_strings[STOP] else oracle
    return plan


def play(processor, make_env, tasks: list[Task], n: int, plan) -> list[Episode]:
    envs = [make_env() for _ in range(len(tasks) * n)]
    return collect(ScriptedEngine(processor, envs, plan), processor, envs, tasks, n, SamplingParams(), LIMITS)


def replay(make_env, task: Task, actions: list[str]):
    """A fresh env at the state after `actions` from `task`, its observation's image and the last
    feedback text (the task's own before any action)."""
    env = make_env()
    obs, _ = env.reset(**task.reset_kwargs())
    feedback = task.feedback
    for a in actions:
        obs = env.step(a)[0]
        feedback = obs["text"]
    return env, obs["image"], feedback
