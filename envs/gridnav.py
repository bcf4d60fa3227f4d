"""`GridNavEnv`: the shared base of the rlfw grid environments (walk to a target square, then stop).

A subclass supplies a layout generator (`_generate`, randomness only through ``self.np_random``)
and the opening words of its prompt (`_intro`); this class owns the rest of the contract: text
actions, the ``{"image", "text"}`` observation, turns, rewards, ``info``, rendering and the BFS
oracle.

Dynamics: each call to `step` is one turn. A move into a wall (or off the grid) leaves the agent in
place; an unparseable action changes nothing; ``stop`` terminates with reward 1.0 if the agent is
on the target, else 0.0. Once ``max_turns`` turns are used without stopping, the episode
truncates. The action space is a `gymnasium.spaces.Text` so that `check_env` can sample it, but
`step` accepts any value: any Python str of any length or content (and any non-str, treated as an
invalid action) gets feedback, never an exception.

``reset(options={"layout": record})`` replays a saved layout (see `envs.layout`) instead of
generating one; its grid must have this env's shape.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.actions import (
    ACTION_STRINGS,
    DELTAS,
    DIRECTION_NAMES,
    MOVED_FEEDBACK,
    OUT_OF_TURNS_FEEDBACK,
    STOP,
    STOP_OFF_TARGET_FEEDBACK,
    STOP_ON_TARGET_FEEDBACK,
    TEXT_CHARSET,
    WALL_FEEDBACK,
    check_action_format,
    invalid_action_feedback,
    parse_action,
    task_prompt,
)
from envs.layout import Pos, distances_to, is_int, is_junction, parse_layout, path_moves, to_record
from envs.render import RED, GridRenderer

RENDER_MODES = ("rgb_array",)
TEXT_MAX_LENGTH = 4096  # observation text: prompts are under 1,000 characters
ACTION_MAX_LENGTH = 1024  # only bounds action_space.sample(); step accepts any length


class GridNavEnv(gym.Env):
    """Base class; see the module docstring. Subclasses call ``super().__init__`` with the shape."""

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": 4}
    target_name = "red square"  # how the prompt names the target
    target_rgb = RED
    state_tags = ("junction", "corridor")  # what `state_tag` returns

    def __init__(
        self,
        shape: tuple[int, int],
        max_turns: int,
        action_format: str,
        cell_px: int,
        render_mode: str | None,
    ):
        if not is_int(max_turns) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        check_action_format(action_format)
        if not is_int(cell_px) or cell_px < 1:
            raise ValueError(f"cell_px must be an int >= 1 (pixels per square), got {cell_px!r}")
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(
                f"unknown render_mode {render_mode!r}; "
                f"valid values: None, {', '.join(RENDER_MODES)}"
            )
        self.shape = shape
        self.max_turns = max_turns
        self.action_format = action_format
        self.cell_px = cell_px
        self.render_mode = render_mode
        self.action_strings: tuple[str, ...] = ACTION_STRINGS[action_format]
        """The 5 canonical action strings in order right, up, left, down, stop."""
        self._invalid_feedback = invalid_action_feedback(action_format)
        height, width = shape[0] * cell_px, shape[1] * cell_px
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (height, width, 3), np.uint8),
                "text": spaces.Text(TEXT_MAX_LENGTH, charset=TEXT_CHARSET),
            }
        )
        self.action_space = spaces.Text(ACTION_MAX_LENGTH, min_length=0, charset=TEXT_CHARSET)
        self._walls: np.ndarray | None = None

    # --- to override ------------------------------------------------------------------------
    def _generate(self) -> tuple[np.ndarray, Pos, Pos]:
        """A new ``(walls, agent, target)`` drawn with ``self.np_random``."""
        raise NotImplementedError

    def _intro(self) -> str:
        """First sentence(s) of the prompt: what the image shows."""
        raise NotImplementedError

    # --- gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        layout = (options or {}).get("layout")
        if layout is None:
            walls, agent, target = self._generate()
        else:
            walls, agent, target = parse_layout(layout)
            if walls.shape != tuple(self.shape):
                raise ValueError(
                    f"layout grid is {walls.shape[0]}x{walls.shape[1]} but this env is "
                    f"{self.shape[0]}x{self.shape[1]}; make the env with a matching size"
                )
        # a layout on the maze already loaded (a restart, another square of it) keeps its distances
        # and background: they depend on the walls and the target alone (and on cell_px and
        # target_rgb, which are fixed for an env's life)
        same_maze = (layout is not None and self._walls is not None and target == self._target
                     and np.array_equal(walls, self._walls))
        if not same_maze:
            self._blocked = walls.tolist()
            self._dist = distances_to(walls, target)
            self._renderer = GridRenderer(walls, target, self.cell_px, self.target_rgb)
        self._walls = walls
        self._agent, self._target = agent, target
        self._turn = 0
        self._success = False
        text = self.prompt()
        return self._obs(text), self._info(invalid=False, bump=False, action=None)

    def step(self, action: Any):
        index = parse_action(action, self.action_format)
        self._turn += 1
        reward, terminated, bump = 0.0, False, False
        if index is None:
            text = self._invalid_feedback
        elif index == STOP:
            terminated = True
            self._success = self._agent == self._target
            reward = 1.0 if self._success else 0.0
            text = STOP_ON_TARGET_FEEDBACK if self._success else STOP_OFF_TARGET_FEEDBACK
        else:
            (dr, dc), (r, c) = DELTAS[index], self._agent
            r, c = r + dr, c + dc
            if 0 <= r < self.shape[0] and 0 <= c < self.shape[1] and not self._blocked[r][c]:
                self._agent = (r, c)
                text = MOVED_FEEDBACK.format(direction=DIRECTION_NAMES[index])
            else:
                bump = True
                text = WALL_FEEDBACK
        truncated = not terminated and self._turn >= self.max_turns
        if truncated:
            text = f"{text} {OUT_OF_TURNS_FEEDBACK}"
        action_str = None if index is None else self.action_strings[index]
        info = self._info(invalid=index is None, bump=bump, action=action_str)
        return self._obs(text), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array":
            return self._renderer.frame(self._agent)
        return None

    # --- rlfw extras --------------------------------------------------------------------------
    def prompt(self) -> str:
        """The task prompt (also the reset observation's text)."""
        return task_prompt(self._intro(), self.target_name, self.action_format, self.max_turns)

    def solve(self) -> list[str]:
        """Oracle action strings from the current state: a BFS shortest path, then stop."""
        moves = path_moves(self._dist, self._agent)
        return [self.action_strings[i] for i in moves] + [self.action_strings[STOP]]

    def best_action(self) -> str:
        """The first oracle action from the current state (stop when on the target)."""
        return self.solve()[0]

    def state_tag(self) -> str:
        """The kind of square the agent stands on: junction (three or four open neighbours, where a
        route chooses a branch) or corridor (any other). Levers may weigh states by it
        (`algo.oracle_tag_weights`)."""
        return "junction" if is_junction(self._walls, self._agent) else "corridor"

    def layout(self) -> dict:
        """The current layout (with the agent's current position) as a replayable record."""
        return to_record(self._walls, self._agent, self._target, self._dist)

    # --- helpers ------------------------------------------------------------------------------
    def _obs(self, text: str) -> dict:
        return {"image": self._renderer.frame(self._agent), "text": text}

    def _info(self, invalid: bool, bump: bool, action: str | None) -> dict:
        return {
            "success": self._success,
            "agent": self._agent,
            "target": self._target,
            "shortest_path": self._dist[self._agent[0]][self._agent[1]],
            "turn": self._turn,
            "invalid_action": invalid,
            "wall_bump": bump,
            "action": action,
        }
