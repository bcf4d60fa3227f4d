"""`rlfw/Maze2D-v0`: VisGym's ``maze_2d`` as a text-action Gymnasium environment.

A perfect maze (one path between any two squares) of odd size N: an (N-1)/2 x (N-1)/2 lattice of
cells at odd (row, col), joined by carved passages, inside a solid outer wall. Difficulty "easy" is
9x9 (a 4x4 lattice), "hard" is 11x11; ``size=`` selects any odd N >= 5 and overrides difficulty.
Agent and target start in opposite corners, one of the four diagonal pairs at random. One move is
one grid square; reward 1.0 only for ``stop`` on the target.

Generation follows VisGym exactly (Wilson's loop-erased random walk, ported from VisGym's
``WilsonMazeGenerator``, itself from CaptainFl1nt/WilsonMazeGenerator): on ``reset(seed=s)`` the
walk is driven by ``random.Random(self.np_random.integers(2**32))`` and the corner pair by
``self.np_random.integers(0, 4)``, so seed s gives the same maze as VisGym's ``reset(seed=s)``
(checked against ``envs/data/visgym_maze2d_seeds_0_63.json``).

Deviations from VisGym: text actions are parsed from free text (`envs.actions`); rendering draws the
target square every frame (VisGym paints white over the target once the agent leaves it); ``stop``
off the target and running out of ``max_turns`` end the episode; images can be any ``cell_px``.
"""

from __future__ import annotations

import random

import numpy as np

from envs.gridnav import GridNavEnv
from envs.layout import Pos, is_int

DIFFICULTY_SIZES = {"easy": 9, "hard": 11}
MIN_SIZE = 5
MAZE_INTRO = (
    "You are navigating a {size}x{size} maze shown in the image: gray squares are walls, "
    "white squares are paths, the blue circle is you and the red square is the target."
)

_WALK = ((0, 1), (1, 0), (0, -1), (-1, 0))  # VisGym's walk directions, in its order


def wilson_lattice(n: int, rng: random.Random) -> np.ndarray:
    """Carve a perfect maze in a ``(2n-1) x (2n-1)`` block (True = open) by Wilson's algorithm.

    Lattice cells sit at even (row, col); the draws from `rng` match VisGym's generator call for
    call, so the same `rng` state gives the same maze.
    """
    side = 2 * n - 1
    carved = np.zeros((side, side), dtype=bool)
    unvisited = [(r, c) for r in range(0, side, 2) for c in range(0, side, 2)]
    visited = {unvisited.pop(rng.randint(0, len(unvisited) - 1))}
    carved[next(iter(visited))] = True
    while unvisited:
        first = current = unvisited[rng.randint(0, len(unvisited) - 1)]
        path: dict[Pos, int] = {}
        while True:
            while True:
                d = rng.randint(0, 3)
                r, c = current[0] + 2 * _WALK[d][0], current[1] + 2 * _WALK[d][1]
                if 0 <= r < side and 0 <= c < side:
                    break
            path[current] = d
            current = (r, c)
            if current in visited:
                break
        current = first
        while current not in visited:
            visited.add(current)
            unvisited.remove(current)
            carved[current] = True
            dr, dc = _WALK[path[current]]
            carved[current[0] + dr, current[1] + dc] = True
            current = (current[0] + 2 * dr, current[1] + 2 * dc)
    return carved


class Maze2DEnv(GridNavEnv):
    """VisGym ``maze_2d``; see the module docstring.

    Args:
        difficulty: "easy" (9x9) or "hard" (11x11).
        size: odd grid side >= 5; overrides `difficulty` when given.
        max_turns: turns before truncation (every step counts, valid or not).
        action_format: "visgym" (``('move', d)``, ``('stop', 'stop')``) or "tagged"
            (``<action>right</action>``).
        cell_px: pixels per grid square (25 gives VisGym's 225x225 easy image).
        render_mode: None or "rgb_array"; the observation always holds the image.
    """

    def __init__(
        self,
        difficulty: str = "easy",
        size: int | None = None,
        max_turns: int = 20,
        action_format: str = "visgym",
        cell_px: int = 25,
        render_mode: str | None = None,
    ):
        if difficulty not in DIFFICULTY_SIZES:
            raise ValueError(
                f"unknown difficulty {difficulty!r}; valid values: {', '.join(DIFFICULTY_SIZES)}"
            )
        if size is None:
            size = DIFFICULTY_SIZES[difficulty]
        if not is_int(size) or size < MIN_SIZE or size % 2 == 0:
            raise ValueError(
                f"size must be an odd int >= {MIN_SIZE} (e.g. 9, 11, 13), got {size!r}"
            )
        self.size = size
        super().__init__((size, size), max_turns, action_format, cell_px, render_mode)

    def _generate(self) -> tuple[np.ndarray, Pos, Pos]:
        rng = random.Random(int(self.np_random.integers(2**32)))
        walls = np.ones((self.size, self.size), dtype=bool)
        walls[1:-1, 1:-1] = ~wilson_lattice((self.size - 1) // 2, rng)
        far = self.size - 2
        corners = (((1, 1), (far, far)), ((far, far), (1, 1)))
        corners += (((far, 1), (1, far)), ((1, far), (far, 1)))  # VisGym's order
        agent, target = corners[int(self.np_random.integers(0, 4))]
        return walls, agent, target

    def _intro(self) -> str:
        return MAZE_INTRO.format(size=self.size)
