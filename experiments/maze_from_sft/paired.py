"""Paired comparison of two policies' greedy evaluations on the same mazes.

Each argument is an evaluation set's folder, `<run>/eval/step_N/<set>` (it holds episodes.jsonl, one
row per maze with its `seed` and `success`). Mazes are matched by seed; what matters is how many
each policy solved that the other did not (a sign test: z = (a - b) / sqrt(a + b)).

    python experiments/maze_from_sft/paired.py [--routes] [--first N] A_DIR B_DIR [A_DIR B_DIR ...]

Several pairs (one per training seed, say) are printed one by one and then pooled. Pooling counts
each seed's episode on a maze as independent, but a hard maze tends to fail on every seed; so pairs
that evaluated the same mazes are also counted per maze: on how many mazes A failed on fewer of the
pairs than B, and on how many on more (the sign test with the mazes, not the episodes, as the sample).

--routes splits that count by the maze's best route (moves on a shortest path), with each policy's
share of episodes failed: the mazes are looked up by seed in eval64 (seeds below 10**6) or
regenerated (held-out seeds, 9x9 rlfw/Maze2D-v0 as the maze env makes them). --first N keeps the N
mazes of lowest seed in each folder (e.g. the first envs.eval_sets.RESERVED_HELDOUT = 1024 held-out
mazes, the ones training never draws, of a larger held-out evaluation).
"""

import argparse
import json
import math
import sys
from pathlib import Path


def successes(folder: str, first: int | None = None) -> dict[int, bool]:
    rows = [json.loads(line) for line in (Path(folder) / "episodes.jsonl").read_text().splitlines() if line]
    rows = sorted(rows, key=lambda row: row["seed"])[:first]
    return {row["seed"]: bool(row["success"]) for row in rows}


def compare(a: dict[int, bool], b: dict[int, bool]) -> tuple[int, int, float, float]:
    """(solved by A only, solved by B only, A's pass@1, B's pass@1) over the same mazes."""
    only_a = sum(a[s] and not b[s] for s in a)
    only_b = sum(b[s] and not a[s] for s in a)
    return only_a, only_b, sum(a.values()) / len(a), sum(b.values()) / len(b)


def z(only_a: int, only_b: int) -> float:
    return (only_a - only_b) / math.sqrt(only_a + only_b) if only_a + only_b else 0.0


def per_maze(pairs: list[tuple[dict[int, bool], dict[int, bool]]]) -> tuple[int, int]:
    """(mazes A failed on fewer of the pairs than B, mazes A failed on more), over pairs of one maze set."""
    fails_a = {m: sum(not a[m] for a, _ in pairs) for m in pairs[0][0]}
    fails_b = {m: sum(not b[m] for _, b in pairs) for m in pairs[0][0]}
    return sum(fails_a[m] < fails_b[m] for m in fails_a), sum(fails_a[m] > fails_b[m] for m in fails_a)


def best_routes(seeds) -> dict[int, int]:
    """Moves on a shortest path of each maze, by seed (eval64's records, or held-out regenerated)."""
    from envs.eval_sets import HELD_OUT_SEED_START, load_eval_set, shortest_moves

    if max(seeds) < 10**6:
        layouts = load_eval_set("eval64")
    else:
        layouts = load_eval_set("generated", n=max(seeds) - HELD_OUT_SEED_START + 1)
    moves = {r["seed"]: shortest_moves(r) for r in layouts}
    return {s: moves[s] for s in seeds}


def by_route(pairs: list[tuple[dict[int, bool], dict[int, bool]]]) -> None:
    """Per best-route length: mazes, each policy's share of episodes failed, the per-maze count."""
    routes = best_routes(pairs[0][0])
    for moves in sorted(set(routes.values())):
        mazes = {m for m, r in routes.items() if r == moves}
        sub = [({m: a[m] for m in mazes}, {m: b[m] for m in mazes}) for a, b in pairs]
        fail_a = sum(not a[m] for a, _ in sub for m in mazes) / (len(sub) * len(mazes))
        fail_b = sum(not b[m] for _, b in sub for m in mazes) / (len(sub) * len(mazes))
        fewer, more = per_maze(sub)
        print(f"  best route {moves:2d} moves: {len(mazes):4d} mazes  failed A {fail_a:6.1%}  B {fail_b:6.1%}"
              f"  per maze fewer {fewer} more {more}  z {z(fewer, more):+.1f}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="A_DIR B_DIR [A_DIR B_DIR ...]")
    ap.add_argument("--routes", action="store_true", help="split the per-maze count by best route length")
    ap.add_argument("--first", type=int, metavar="N", help="keep the N mazes of lowest seed in each folder")
    args = ap.parse_args(argv)
    if len(args.dirs) % 2:
        ap.error("folders come in pairs: A_DIR B_DIR [A_DIR B_DIR ...]")
    if args.first is not None and args.first < 1:
        ap.error("--first takes a number of mazes >= 1")
    total_a = total_b = 0
    sets: dict[frozenset, list[tuple[dict[int, bool], dict[int, bool]]]] = {}
    for a_dir, b_dir in zip(args.dirs[::2], args.dirs[1::2]):
        a, b = successes(a_dir, args.first), successes(b_dir, args.first)
        if a.keys() != b.keys():
            sys.exit(f"{a_dir} and {b_dir} evaluated different mazes ({len(a)} and {len(b)}; "
                     f"{len(a.keys() ^ b.keys())} not in both)")
        only_a, only_b, pa, pb = compare(a, b)
        total_a, total_b = total_a + only_a, total_b + only_b
        sets.setdefault(frozenset(a), []).append((a, b))
        print(f"{len(a)} mazes  A {pa:.3f}  B {pb:.3f}  A only {only_a}  B only {only_b}  z {z(only_a, only_b):+.1f}"
              f"\n  A: {a_dir}\n  B: {b_dir}")
    if len(args.dirs) > 2:
        print(f"pooled: A only {total_a}  B only {total_b}  z {z(total_a, total_b):+.1f}")
    for mazes, pairs in sets.items():
        if len(pairs) > 1:
            fewer, more = per_maze(pairs)
            print(f"per maze, {len(pairs)} pairs on the same {len(mazes)} mazes: A failed on fewer of them {fewer}, "
                  f"on more {more}  z {z(fewer, more):+.1f}")
        if args.routes:
            by_route(pairs)


if __name__ == "__main__":
    main(sys.argv[1:])
