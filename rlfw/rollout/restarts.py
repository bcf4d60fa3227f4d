"""Where a step's groups start: fresh training mazes, and restarts from the first wrong move
(`algo.restart_fraction`).

GRPO's remaining maze errors are confident ones, so a group sampled from a maze's start seldom
reaches the square where the policy errs and tries the other move there. A restart starts a whole
group at the state just before the first move of a recent training episode that differed from the
oracle's (`Episode.parsed_actions[t] != Episode.oracle_actions[t]`, t the first such turn), so all
its samples face that decision. (Restarting from states of earlier rollouts is Go-Explore's and the
"reverse curriculum"'s idea; here the states are the policy's own first mistakes.)

- **The state.** The episode's task is replayed on a scratch env with its first t replies, so the
  restart is exactly the state the policy saw at turn t: the maze with the agent on that square
  (`Task.layout`, the env's `layout()` record) and the previous turn's feedback text
  (`Task.feedback`). The task prompt, which names env.max_turns, is the same as the original's.
- **The turn budget** is the original episode's remaining turns (`Task.max_turns` = its budget
  - t). A restart continues that episode: its reward is what the choice at that square leads to
  within the limit the original (and every evaluation episode) has, so the group's advantages rank
  moves by the outcome the evaluation grades. A full budget would give a late square turns no real
  episode has there, rewarding detours that would fail under the real limit. The moves before t
  were the oracle's, so a restart is solvable in its remaining turns exactly when its maze was.
- **Only training episodes** feed the buffer (`train.rollout_step` is the only caller of `record`),
  so a restart's maze is a training maze that passed `rlfw.build.training_filter`, never an
  evaluation maze. Entries are committed once a step's rollouts have all succeeded, so a step
  whose rollouts are redone after an engine failure does not record them twice.
- **Bounded and resume-exact.** The buffer keeps the `algo.restart_buffer_size` most recent
  distinct states. Which of them a round draws is a function of (seed, step, round), and the buffer
  is saved in the checkpoint's trainer state (`state_dict`), so step N's rollouts stay a function
  of (seed, N, the weights, the checkpointed buffer) and a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Optional

import numpy as np

from rlfw.rollout.types import Episode, Task


def first_wrong_move(episode: Episode) -> Optional[int]:
    """The first turn whose parsed action was not the oracle's; None if there is none or a turn
    has no label (an env without an oracle)."""
    for t, (oracle, played) in enumerate(zip(episode.oracle_actions, episode.parsed_actions)):
        if oracle is None:
            return None
        if played != oracle:
            return t
    return None


def _key(task: Task) -> str:
    return json.dumps([task.layout, task.feedback, task.max_turns], sort_keys=True)


class StartStates:
    """A step's tasks: `fresh(step, round, n)` training tasks, and with `fraction > 0` that share of
    each round's groups from the buffer of first-wrong-move states (see the module docstring)."""

    def __init__(self, fresh: Callable[[int, int, int], list[Task]], make_env=None, seed: int = 0,
                 fraction: float = 0.0, capacity: int = 64, max_turns: int = 0):
        self.fresh, self.seed, self.fraction, self.capacity = fresh, seed, fraction, capacity
        self.max_turns = max_turns  # the loop's turn limit: a fresh task's budget
        self.env = make_env() if fraction > 0 else None  # scratch env for replays
        self.buffer: list[Task] = []  # oldest first

    def tasks(self, step: int, round_: int, n: int) -> list[Task]:
        """`n` tasks for this round: fresh ones, then round(fraction * n) restarts (fewer while the
        buffer holds fewer), drawn without replacement by (seed, step, round)."""
        k = min(len(self.buffer), int(self.fraction * n + 0.5))
        picks = np.random.default_rng([self.seed, step, round_, 2]).choice(len(self.buffer), size=k, replace=False)
        return self.fresh(step, round_, n - k) + [self.buffer[i] for i in picks.tolist()]

    def restart_of(self, episode: Episode, turn: int) -> Task:
        """The task that starts at the state turn `turn` of `episode` saw, with its remaining turns."""
        task = episode.task
        obs, _ = self.env.reset(**task.reset_kwargs())
        feedback = task.feedback
        for action in episode.actions[:turn]:
            obs = self.env.step(action)[0]
            feedback = obs["text"]
        budget = min(self.max_turns, task.max_turns or self.max_turns)
        return Task(seed=task.seed, layout=self.env.unwrapped.layout(), feedback=feedback, max_turns=budget - turn)

    def record(self, episodes: list[Episode]) -> None:
        """Add the first-wrong-move states of a step's training episodes (never evaluation ones)."""
        if self.fraction == 0:
            return
        known = {_key(t) for t in self.buffer}
        for e in episodes:
            turn = first_wrong_move(e)
            if turn is None:
                continue
            task = self.restart_of(e, turn)
            if _key(task) not in known:
                known.add(_key(task))
                self.buffer.append(task)
        del self.buffer[: max(0, len(self.buffer) - self.capacity)]

    def metrics(self, episodes: list[Episode]) -> dict[str, float]:
        """`train/restart_groups` (groups of this step that started from a restart) and
        `train/restart_buffer` (states held); nothing when restarts are off."""
        if self.fraction == 0:
            return {}
        groups = {e.group_id for e in episodes if e.task.max_turns is not None}
        return {"train/restart_groups": float(len(groups)), "train/restart_buffer": float(len(self.buffer))}

    def state_dict(self) -> dict:
        """The buffer as JSON-able records, for the checkpoint's trainer state."""
        return {"buffer": [dataclasses.asdict(t) for t in self.buffer]}

    def load_state_dict(self, state: dict | None) -> None:
        self.buffer = [Task(**t) for t in (state or {}).get("buffer", [])]
