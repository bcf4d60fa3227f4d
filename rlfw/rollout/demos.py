"""Oracle demonstrations from fresh training mazes: the states `rlfw.sft` trains on, and that GRPO's
oracle term can add beside the states the policy visited (`algo.oracle_fresh_states`).

A state is (image, task text, feedback, action): the env's observation at a square, the feedback
text that the move into it produced, and the env's `best_action()` there. `to_segment` turns one
into a training segment in exactly the format the RL rollout uses with `history=none`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from envs.actions import DELTAS
from envs.layout import is_junction, open_moves, parse_layout
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import turn_message
from rlfw.rollout.oracle import answer_segment
from rlfw.rollout.types import Segment


class DemoSampler:
    """Oracle-labelled states from fresh training mazes, as (image, task text, feedback, action)."""

    def __init__(self, make_env, seed: int, mode: str, noise: float, allowed: Callable[[int], bool] | None = None,
                 junction_fraction: float = 0.0):
        from envs.eval_sets import TRAIN_SEEDS

        self.env = make_env()
        self.rng = np.random.default_rng(seed)
        self.seeds = TRAIN_SEEDS
        self.mode, self.noise, self.allowed = mode, noise, allowed
        self.junction_fraction = junction_fraction
        self.n_moves = len(self.env.unwrapped.action_strings) - 1  # the last action is stop

    def state_dict(self) -> dict:
        """The stream's position: every state is drawn from a maze the generator picks and the env
        resets to by seed, so the generator's state is all a resumed run needs to draw the same ones."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]

    def _reset(self) -> tuple[int, dict, dict | None]:
        """Reset the env to a fresh training maze that is not an evaluation maze; (seed, observation,
        layout). A filter that can judge a layout (`admits`, rlfw.build.TrainingFilter's) judges the
        one just generated; a plain `allowed(seed)` is asked before the reset, as is any filter for
        an env without `layout()` (whose layout is None)."""
        u = self.env.unwrapped
        has_layout = hasattr(u, "layout")
        admits = getattr(self.allowed, "admits", None) if has_layout else None
        while True:
            seed = int(self.rng.integers(self.seeds.start, self.seeds.stop))
            if admits is None and self.allowed is not None and not self.allowed(seed):
                continue
            obs, _ = self.env.reset(seed=seed)
            layout = u.layout() if has_layout else None
            if admits is None or admits(layout):
                return seed, obs, layout

    def _label(self, obs: dict, task: str, feedback: str) -> tuple:
        return obs["image"], task, feedback, self.env.unwrapped.best_action()

    def _all_squares(self) -> tuple:
        """A random open square (its genuine feedback from one random move), or the start state; with
        `junction_fraction`, that fraction of the states are junctions instead (`_junction`)."""
        env, u = self.env, self.env.unwrapped
        _, obs, record = self._reset()
        task = obs["text"]
        if self.junction_fraction and self.rng.random() < self.junction_fraction:
            if (state := self._junction(record, task)) is not None:
                return state
        if self.rng.random() < 1 / 6:
            return self._label(obs, task, "")
        open_cells = [(r, c) for r, row in enumerate(record["grid"]) for c, ch in enumerate(row) if ch == "."]
        r, c = open_cells[self.rng.integers(len(open_cells))]
        env.reset(options={"layout": {**record, "agent": [r, c]}})
        obs = env.step(u.action_strings[self.rng.integers(self.n_moves)])[0]
        return self._label(obs, task, obs["text"])

    def _junction(self, record: dict, task: str) -> tuple | None:
        """A random junction of the maze (three or four open neighbours), entered by a move from a
        random open neighbour, so its feedback is the genuine "Moved ..." of arriving there; None if
        the maze has no junction."""
        env, u = self.env, self.env.unwrapped
        walls = parse_layout(record)[0]
        junctions = [(r, c) for r, c in zip(*np.nonzero(~walls)) if is_junction(walls, (r, c))]
        if not junctions:
            return None
        r, c = junctions[self.rng.integers(len(junctions))]
        moves = open_moves(walls, (r, c))
        dr, dc = DELTAS[moves[self.rng.integers(len(moves))]]  # towards the neighbour we arrive from
        env.reset(options={"layout": {**record, "agent": [int(r + dr), int(c + dc)]}})
        back = DELTAS.index((-dr, -dc))
        obs = env.step(u.action_strings[back])[0]
        return self._label(obs, task, obs["text"])

    def _oracle_path(self, n: int) -> list[tuple]:
        env, u = self.env, self.env.unwrapped
        out: list[tuple] = []
        while len(out) < n:
            obs = self._reset()[1]
            task, feedback = obs["text"], ""
            for _ in range(u.max_turns):
                out.append(self._label(obs, task, feedback))
                off_path = self.rng.random() < self.noise
                action = u.action_strings[self.rng.integers(self.n_moves)] if off_path else u.best_action()
                obs, _, terminated, truncated, _ = env.step(action)
                feedback = obs["text"]
                if terminated or truncated:
                    break
        idx = self.rng.permutation(len(out))[:n]
        return [out[i] for i in idx]

    def sample(self, n: int, seed: int | None = None) -> list[tuple]:
        """`n` labelled states; `seed` restarts the stream first, so that a draw depends on it alone
        (a GRPO step's fresh states on (run seed, step), and a resumed run repeats them)."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        if self.mode == "oracle_path":
            return self._oracle_path(n)
        return [self._all_squares() for _ in range(n)]


def to_segment(processor: PolicyProcessor, image, task: str, feedback: str, action: str) -> Segment:
    """One labelled state as a training segment: the rollout's user turn for it (`history=none`),
    the generation prompt, then `action` and EOS, which alone carry loss."""
    prompt = processor.encode_message(turn_message(task, feedback), [image]) + processor.generation_prompt_ids
    return answer_segment(processor, prompt, [image], action)
