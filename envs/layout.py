"""Grid layouts: validation of saved records, BFS distances, and the record format itself.

A layout record is a plain JSON-able dict, the format of ``envs/data/*.json``::

    {"grid": ["#####", "#...#", ...],   # rows of '#' (wall) and '.' (floor)
     "agent": [row, col], "target": [row, col],
     "shortest_moves": 12}              # optional on input; extra keys are ignored

Internally a layout is a boolean ``walls`` array (True = wall) plus agent and target positions as
``(row, col)`` tuples. Moves between edge squares and outside the grid count as wall bumps, so a
record needs no outer wall (the mazes have one anyway).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from envs.actions import DELTAS

WALL, FLOOR = "#", "."

Pos = tuple[int, int]


def is_int(value: object) -> bool:
    """True for Python and numpy integers, False for bools and everything else."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def distances_to(walls: np.ndarray, target: Pos) -> list[list[int]]:
    """Number of moves from every square to `target` (BFS); -1 for walls and unreachable squares."""
    rows, cols = walls.shape
    blocked = walls.tolist()
    dist = [[-1] * cols for _ in range(rows)]
    dist[target[0]][target[1]] = 0
    queue = deque([target])
    while queue:
        r, c = queue.popleft()
        d = dist[r][c] + 1
        for dr, dc in DELTAS:
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and not blocked[nr][nc] and dist[nr][nc] < 0:
                dist[nr][nc] = d
                queue.append((nr, nc))
    return dist


def oracle_moves(walls: np.ndarray, agent: Pos, target: Pos) -> list[int]:
    """Move indices of a shortest path from `agent` to `target` (ties: right, up, left, down)."""
    dist = distances_to(walls, target)
    return path_moves(dist, agent)


def open_moves(walls: np.ndarray, square: Pos) -> list[int]:
    """Move indices from `square` that lead to an open square (not a wall, not off the grid)."""
    (r, c), (rows, cols) = square, walls.shape
    return [i for i, (dr, dc) in enumerate(DELTAS)
            if 0 <= r + dr < rows and 0 <= c + dc < cols and not walls[r + dr, c + dc]]


def is_junction(walls: np.ndarray, square: Pos) -> bool:
    """Three or four open neighbours: a square where the route has to choose a branch."""
    return len(open_moves(walls, square)) >= 3


def path_moves(dist: list[list[int]], agent: Pos) -> list[int]:
    """Follow `dist` (from `distances_to`) downhill from `agent`; the first move wins ties."""
    r, c = agent
    moves = []
    while dist[r][c] > 0:
        for i, (dr, dc) in enumerate(DELTAS):
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(dist) and 0 <= nc < len(dist[0]) and dist[nr][nc] == dist[r][c] - 1:
                moves.append(i)
                r, c = nr, nc
                break
    return moves


def to_record(walls: np.ndarray, agent: Pos, target: Pos, dist: list[list[int]] | None = None) -> dict:
    """The JSON-able record of a layout, with its shortest path length (from `dist`, the layout's
    `distances_to(walls, target)`, when the caller has it)."""
    dist = distances_to(walls, target) if dist is None else dist
    return {
        "grid": ["".join(WALL if w else FLOOR for w in row) for row in walls.tolist()],
        "agent": list(agent),
        "target": list(target),
        "shortest_moves": dist[agent[0]][agent[1]],
    }


def _position(record: Mapping, key: str, walls: np.ndarray) -> Pos:
    value = record[key]
    ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
    if not ok or not all(is_int(v) for v in value):
        raise ValueError(f"layout {key!r} must be [row, col] with two ints, got {value!r}")
    r, c = int(value[0]), int(value[1])
    rows, cols = walls.shape
    if not (0 <= r < rows and 0 <= c < cols):
        raise ValueError(f"layout {key} {[r, c]} is outside the {rows}x{cols} grid")
    if walls[r, c]:
        raise ValueError(f"layout {key} {[r, c]} is on a wall ('#'); it must be on a floor '.'")
    return r, c


def parse_layout(record: Mapping) -> tuple[np.ndarray, Pos, Pos]:
    """Validate a layout record and return ``(walls, agent, target)``.

    Raises ValueError with a message saying what is wrong: missing keys, an empty or
    non-rectangular grid, characters other than '#' and '.', agent or target off the grid or on a
    wall, or a target the agent cannot reach.
    """
    if not isinstance(record, Mapping):
        raise ValueError(
            f"layout must be a dict with 'grid', 'agent', 'target', got {type(record).__name__}"
        )
    missing = [k for k in ("grid", "agent", "target") if k not in record]
    if missing:
        raise ValueError(f"layout is missing key(s) {missing}; it needs 'grid', 'agent', 'target'")
    grid = record["grid"]
    if isinstance(grid, str) or not isinstance(grid, Sequence) or not grid:
        raise ValueError("layout 'grid' must be a non-empty list of row strings of '#' and '.'")
    width = None
    for i, row in enumerate(grid):
        if not isinstance(row, str):
            raise ValueError(f"layout grid row {i} must be a str of '#' and '.', got {row!r}")
        width = len(row) if width is None else width
        if len(row) != width or not row:
            raise ValueError(
                f"layout grid is not rectangular: row {i} has length {len(row)}, row 0 has {width}"
            )
        bad = set(row) - {WALL, FLOOR}
        if bad:
            col = min(row.index(ch) for ch in bad)
            raise ValueError(
                f"layout grid has unknown character {row[col]!r} at row {i}, col {col}; "
                "use '#' for a wall and '.' for a floor"
            )
    walls = np.array([[ch == WALL for ch in row] for row in grid], dtype=bool)
    agent = _position(record, "agent", walls)
    target = _position(record, "target", walls)
    if distances_to(walls, target)[agent[0]][agent[1]] < 0:
        raise ValueError(f"layout target {list(target)} cannot be reached from agent {list(agent)}")
    return walls, agent, target
