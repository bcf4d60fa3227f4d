"""Evaluation sets of layouts: VisGym's fixed mazes and held-out sets from our own generator.

A set is a list of layout records (``grid``, ``agent``, ``target``, ``shortest_moves``, ``seed``),
replayed with ``env.reset(options={"layout": record})`` on an env of the same grid size
(``size=len(record["grid"])``).

- ``load_eval_set("eval64")``: VisGym ``maze_2d`` easy (9x9), seeds 0..63, from
  ``envs/data/visgym_maze2d_seeds_0_63.json``; ``"eval64_hard"``: the 11x11 ones.
- ``load_layout_file(path)``: a JSON list of such records, e.g. a few copied from the file above.
- ``load_eval_set("generated", n=512, seed_start=HELD_OUT_SEED_START, difficulty="easy")``:
  ``reset(seed=s)`` of ``rlfw/Maze2D-v0`` (or ``env_id=``) for ``s`` in
  ``seed_start .. seed_start+n-1``; other keyword arguments go to the env. `EvalSetSpec` holds
  the same fields.

Seed convention: ``TRAIN_SEEDS = range(10**6, 10**9)`` for training, seeds ``>= 10**9``
(`HELD_OUT_SEED_START`) for generated held-out sets, seeds below ``10**6`` reserved for reference
sets (our generator reproduces VisGym's, so training on seeds 0..63 would replay ``eval64``).
Disjoint seeds do not guarantee disjoint mazes: a 4x4 lattice has only about 10**5 perfect mazes,
and 2,000 SFT steps of 64 fresh mazes meet about a third of ``eval64``. So training also skips
every layout in `reserved_keys` (VisGym's fixed sets and the first `RESERVED_HELDOUT` held-out
layouts of the same generator): ``rlfw.sft`` and ``rlfw.run`` never train on a maze they evaluate on.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym

from envs.layout import distances_to, parse_layout

DATA_FILE = Path(__file__).parent / "data" / "visgym_maze2d_seeds_0_63.json"
FIXED_SETS = {"eval64": "maze_2d/easy", "eval64_hard": "maze_2d/hard"}
HELD_OUT_SEED_START = 10**9
TRAIN_SEEDS = range(10**6, HELD_OUT_SEED_START)
RESERVED_HELDOUT = 1024
"""Held-out layouts kept out of training even when a run evaluates on fewer."""


@dataclass(frozen=True)
class EvalSetSpec:
    """A generated evaluation set: one layout per seed of ``seed_start .. seed_start+n-1``."""

    n: int = 512
    """Number of layouts."""
    seed_start: int = HELD_OUT_SEED_START
    """First seed; must be >= HELD_OUT_SEED_START so the set stays disjoint from TRAIN_SEEDS."""
    env_id: str = "rlfw/Maze2D-v0"
    """Registered rlfw grid env that generates the layouts (it must have ``layout()``)."""
    env_kwargs: Mapping = field(default_factory=dict)
    """Constructor arguments of the env, e.g. ``{"difficulty": "hard"}`` or ``{"size": 13}``."""

    def __post_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if not isinstance(self.seed_start, int) or self.seed_start < HELD_OUT_SEED_START:
            raise ValueError(
                f"seed_start={self.seed_start!r} overlaps the training seeds {TRAIN_SEEDS}; "
                f"held-out sets must use seeds >= HELD_OUT_SEED_START = {HELD_OUT_SEED_START}"
            )


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    with open(DATA_FILE, encoding="utf-8") as f:
        return json.load(f)


def generate_layouts(spec: EvalSetSpec) -> list[dict]:
    """The layouts of `spec`, each a record with its ``seed``."""
    env = gym.make(spec.env_id, **dict(spec.env_kwargs)).unwrapped
    records = []
    for seed in range(spec.seed_start, spec.seed_start + spec.n):
        env.reset(seed=seed)
        records.append({**env.layout(), "seed": seed})
    env.close()
    return records


def load_eval_set(name: str, **kwargs) -> list[dict]:
    """Layout records of a named set: "eval64", "eval64_hard" or "generated" (see module doc).

    For "generated", ``n``, ``seed_start`` and ``env_id`` are `EvalSetSpec` fields and any other
    keyword argument is an env argument (``difficulty="hard"``, ``size=13``).
    """
    if name in FIXED_SETS:
        if kwargs:
            raise ValueError(f"eval set {name!r} is fixed and takes no arguments, got {kwargs}")
        return copy.deepcopy(_data()["sets"][FIXED_SETS[name]])
    if name == "generated":
        fields = {k: kwargs.pop(k) for k in ("n", "seed_start", "env_id") if k in kwargs}
        return generate_layouts(EvalSetSpec(**fields, env_kwargs=kwargs))
    valid = ", ".join([*FIXED_SETS, "generated"])
    raise ValueError(f"unknown eval set {name!r}; valid values: {valid}")


def load_layout_file(path: str | Path) -> list[dict]:
    """Layout records from a JSON file holding a list of them (like each list under ``sets`` in
    `DATA_FILE`: ``grid``, ``agent``, ``target``, optional ``seed`` and ``shortest_moves``).

    Raises ValueError saying what is wrong: a missing or unreadable file, JSON that is not a
    non-empty list, a record `parse_layout` rejects, or a ``seed`` that is not an int.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"layouts file {path} does not exist")
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"layouts file {path} is not readable JSON: {exc}") from None
    if not isinstance(records, list) or not records:
        hint = " (for envs/data's file, copy one list from under its 'sets')" if isinstance(records, dict) else ""
        raise ValueError(f"layouts file {path} must hold a non-empty JSON list of layout records "
                         f"({{'grid': [...], 'agent': [r, c], 'target': [r, c]}}), got {type(records).__name__}{hint}")
    for i, record in enumerate(records):
        try:
            parse_layout(record)
        except ValueError as exc:
            raise ValueError(f"layouts file {path}, record {i}: {exc}") from None
        if "seed" in record and (isinstance(record["seed"], bool) or not isinstance(record["seed"], int)):
            raise ValueError(f"layouts file {path}, record {i}: 'seed' must be an int, got {record['seed']!r}")
    return records


def shortest_moves(layout: Mapping) -> int:
    """Moves on a shortest path from agent to target (the record's value, else computed)."""
    if "shortest_moves" in layout:
        return int(layout["shortest_moves"])
    walls, agent, target = parse_layout(layout)
    return distances_to(walls, target)[agent[0]][agent[1]]


def solvable_within(layout: Mapping, max_turns: int) -> bool:
    """Whether an optimal agent succeeds in `max_turns`: shortest moves + 1 stop <= max_turns."""
    return shortest_moves(layout) + 1 <= max_turns


def solvable_fraction(layouts: Iterable[Mapping], max_turns: int) -> float:
    """Fraction of `layouts` solvable within `max_turns` (the success rate of a perfect agent)."""
    flags = [solvable_within(layout, max_turns) for layout in layouts]
    if not flags:
        raise ValueError("solvable_fraction needs at least one layout")
    return sum(flags) / len(flags)


def layout_key(layout: Mapping) -> tuple:
    """Hashable identity of a layout (grid, agent, target), e.g. to keep eval mazes out of training.
    """
    return tuple(layout["grid"]), tuple(layout["agent"]), tuple(layout["target"])


def reserved_keys(env_id: str = "rlfw/Maze2D-v0", n_heldout: int = RESERVED_HELDOUT, **env_kwargs) -> frozenset:
    """`layout_key`s no training maze may have: every fixed set, and the first `n_heldout` held-out
    layouts of `env_id` with `env_kwargs` (the generator and grid size the run trains on)."""
    keys = {layout_key(r) for name in FIXED_SETS for r in load_eval_set(name)}
    keys |= {layout_key(r) for r in load_eval_set("generated", n=n_heldout, env_id=env_id, **env_kwargs)}
    return frozenset(keys)
