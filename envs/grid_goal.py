"""`rlfw/GridGoal-v0`: walk the blue agent onto the green square of an open grid, then stop.

A simpler sibling of `rlfw/Maze2D-v0` with the same actions, observation, rewards and oracle: an
N x N grid of floor squares (no outer wall) with a few random gray obstacles. Agent, target and
obstacles are distinct random squares drawn with ``self.np_random``; draws whose target is cut off
from the agent are redrawn, so every episode is solvable.
"""

from __future__ import annotations

import numpy as np

from envs.gridnav import GridNavEnv
from envs.layout import Pos, distances_to, is_int
from envs.render import GREEN

MIN_SIZE = 3
GRID_GOAL_INTRO = (
    "You are on a {size}x{size} grid shown in the image: white squares are free, gray squares "
    "are obstacles, the blue circle is you and the green square is the target."
)


class GridGoalEnv(GridNavEnv):
    """Open grid with obstacles; see the module docstring.

    Args:
        size: grid side, an int >= 3.
        obstacles: number of obstacle squares, 0 <= obstacles <= size*size // 4.
        max_turns, action_format, cell_px, render_mode: as for `envs.maze2d.Maze2DEnv`.
    """

    target_name = "green square"
    target_rgb = GREEN

    def __init__(
        self,
        size: int = 5,
        obstacles: int = 3,
        max_turns: int = 20,
        action_format: str = "visgym",
        cell_px: int = 25,
        render_mode: str | None = None,
    ):
        if not is_int(size) or size < MIN_SIZE:
            raise ValueError(f"size must be an int >= {MIN_SIZE}, got {size!r}")
        limit = size * size // 4
        if not is_int(obstacles) or not 0 <= obstacles <= limit:
            raise ValueError(
                f"obstacles must be an int in [0, {limit}] (size*size // 4) for size {size}, "
                f"got {obstacles!r}"
            )
        self.size = size
        self.obstacles = obstacles
        super().__init__((size, size), max_turns, action_format, cell_px, render_mode)

    def _generate(self) -> tuple[np.ndarray, Pos, Pos]:
        while True:
            n = self.size * self.size
            squares = self.np_random.choice(n, self.obstacles + 2, replace=False)
            agent, target = (divmod(int(s), self.size) for s in squares[:2])
            walls = np.zeros((self.size, self.size), dtype=bool)
            walls.flat[squares[2:]] = True
            if distances_to(walls, target)[agent[0]][agent[1]] > 0:
                return walls, agent, target

    def _intro(self) -> str:
        return GRID_GOAL_INTRO.format(size=self.size)
