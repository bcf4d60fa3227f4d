"""Throughput of `rlfw/Maze2D-v0` (easy): seeded resets, steps and renders per second.

Prints a Markdown table, one row per ``cell_px``. Steps cycle through the four moves and reset
when an episode ends; each step includes parsing the action text and rendering the observation.

    python scripts/bench_env.py            # from the repo root, after `pip install -e .`
    python scripts/bench_env.py --smoke    # tiny counts, for tests
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import envs  # noqa: F401  (registers rlfw/ envs)


def rate(fn, n: int) -> float:
    """Calls of `fn` per second over `n` calls."""
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def bench(cell_px: int, n: int) -> dict[str, float]:
    env = gym.make("rlfw/Maze2D-v0", cell_px=cell_px, render_mode="rgb_array").unwrapped
    env.reset(seed=0)
    moves = env.action_strings[:4]

    def step(i):
        _, _, terminated, truncated, _ = env.step(moves[i % 4])
        if terminated or truncated:
            env.reset()

    result = {
        "reset/s": rate(lambda i: env.reset(seed=i), n),
        "step/s": rate(step, n),
        "render/s": rate(lambda i: env.render(), n),
    }
    env.close()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny counts, no meaningful timing")
    parser.add_argument("--n", type=int, default=5000, help="calls per measurement")
    args = parser.parse_args(argv)
    n = 20 if args.smoke else args.n
    print(f"rlfw/Maze2D-v0 easy (9x9), {n} calls each\n")
    print("| cell_px | image | reset/s | step/s | render/s |")
    print("|---:|---:|---:|---:|---:|")
    for cell_px in (25, 8):
        r = bench(cell_px, n)
        side = 9 * cell_px
        print(
            f"| {cell_px} | {side}x{side} | {r['reset/s']:,.0f} | {r['step/s']:,.0f} "
            f"| {r['render/s']:,.0f} |"
        )


if __name__ == "__main__":
    main()
