"""`rlfw/MazeStep-v0`: one step of a maze. Name a next move on a shortest path to the target.

A single-turn variant of `rlfw/Maze2D-v0`, for benchmarks and one-turn RL. ``reset(seed=s)`` builds
Maze2D's maze for seed s and puts the agent on a random open square other than the target (drawn
with ``self.np_random``, so a seed gives the same state every time). The observation, the prompt
(Maze2D's own task text, which mentions ``max_turns``) and the action strings are Maze2D's.
``reset(options={"layout": record})`` replays a saved state exactly, agent included.

`step` takes one action and always terminates. The reward is 1.0 when the action is one of the BFS
oracle's best actions from the state the agent was in: any move that brings it one square closer to
the target (every move on some shortest path, when several are), or ``stop`` while on the target
(a replayed layout can put it there). Anything else gets 0.0: a move off every shortest path, a
wall bump, ``stop`` elsewhere, or text with no valid action. The agent still moves as in Maze2D,
and the feedback text and ``info`` keys are Maze2D's, plus ``info["best_actions"]`` (the actions
that would have scored 1.0). ``info["success"]`` is True when the reward is 1.0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.actions import DELTAS, OUT_OF_TURNS_FEEDBACK, STOP, parse_action
from envs.layout import Pos
from envs.maze2d import Maze2DEnv


class MazeStepEnv(Maze2DEnv):
    """Maze2D from a random open square, for one step; see the module docstring.

    Takes Maze2D's arguments; `max_turns` only appears in the prompt text (an episode is one step),
    so its default of 20 keeps the prompt a Maze2D policy was trained on.
    """

    def _generate(self) -> tuple[np.ndarray, Pos, Pos]:
        walls, _, target = super()._generate()
        rows, cols = np.nonzero(~walls)
        squares = [(int(r), int(c)) for r, c in zip(rows, cols) if (r, c) != target]
        agent = squares[int(self.np_random.integers(len(squares)))]
        return walls, agent, target

    def best_actions(self) -> list[str]:
        """Every action that scores 1.0 from the current state (see the module docstring)."""
        (r, c), dist = self._agent, self._dist
        if dist[r][c] == 0:
            return [self.action_strings[STOP]]
        rows, cols = self.shape
        return [self.action_strings[i] for i, (dr, dc) in enumerate(DELTAS)
                if 0 <= r + dr < rows and 0 <= c + dc < cols and dist[r + dr][c + dc] == dist[r][c] - 1]

    def check(self, action: Any) -> float:
        """The reward `step(action)` would give from the current state, without stepping."""
        index = parse_action(action, self.action_format)
        return 1.0 if index is not None and self.action_strings[index] in self.best_actions() else 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "best_actions": self.best_actions()}

    def step(self, action: Any):
        best, reward = self.best_actions(), self.check(action)
        obs, _, _, truncated, info = super().step(action)  # moves the agent, gives Maze2D's feedback
        if truncated:  # max_turns=1: the episode ends by design, not by running out of turns
            obs = {**obs, "text": obs["text"].removesuffix(f" {OUT_OF_TURNS_FEEDBACK}")}
        self._success = reward == 1.0
        info = {**info, "success": self._success, "best_actions": best}
        return obs, reward, True, False, info

