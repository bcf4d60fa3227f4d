"""The SFT stage's data path (`rlfw.rollout.demos`: oracle-labelled states from fresh training mazes,
then `to_segment`) against the way it used to work, part by part:

- drawing states: the sampler judges the maze it generated itself (`TrainingFilter.admits`), against
  asking a seed filter first, whose probe env generates every maze a second time;
- encoding states: `PolicyProcessor` keeps the ids of the texts it has encoded (an env repeats a
  handful of task and feedback texts), against tokenizing every message again;
- resetting the env to a layout: another square of the maze already loaded (its BFS distances and
  background kept), against a square of a different maze each time;
- the whole path (draw and encode, as the stage's step does before its forward): the first two
  baselines together against today's code. The env's kept distances are on both sides of this row.

The settings are the main job's stage: the maze env, all_squares states, half of them at junctions,
the training filter with 512 held-out mazes reserved. No model is loaded: this is Python and numpy
work. The sides alternate (A B A B ...) over the rounds, so a noisy machine slows both alike; the
table gives each side's median and the ratio.

    python scripts/bench_sft_data.py               # 640 states a side a round, 5 rounds
    python scripts/bench_sft_data.py --smoke       # seconds
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rlfw.build import make_env_fn, training_filter
from rlfw.config import MazeEnvConfig
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.demos import DemoSampler, to_segment

ROOT = Path(__file__).resolve().parents[1]


class EncodeEveryTime(PolicyProcessor):
    """The processor as it was: every text goes through the tokenizer."""

    def _encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "checkpoints" / "tiny_vl_maze_sft"),
                    help="a policy folder (its processor only)")
    ap.add_argument("--states", type=int, default=640, help="states per side per round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side, alternating")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = ap.parse_args()
    if args.smoke:
        args.states, args.rounds = 16, 1

    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0")
    processors = {"before": EncodeEveryTime.from_pretrained(args.model),
                  "now": PolicyProcessor.from_pretrained(args.model)}
    make_env = make_env_fn(env_cfg, processors["now"].crop_px)
    allowed = training_filter(env_cfg, 512)
    samplers = {"before": DemoSampler(make_env, 0, "all_squares", 0.0, lambda seed: allowed(seed), 0.5),
                "now": DemoSampler(make_env, 0, "all_squares", 0.0, allowed, 0.5)}
    states = samplers["now"].sample(args.states, seed=0)
    env = make_env()
    env.reset(seed=10**6)
    loaded = env.unwrapped.layout()
    other_env = make_env()
    other_env.reset(seed=10**6 + 1)
    squares = [[r, c] for r, row in enumerate(loaded["grid"]) for c, ch in enumerate(row) if ch == "."]
    other = other_env.unwrapped.layout()

    def timed(fn, n: int) -> float:
        t0 = time.perf_counter()
        fn()
        return n / (time.perf_counter() - t0)

    def draw(side: str, r: int) -> float:
        return timed(lambda: samplers[side].sample(args.states, seed=r), args.states)

    def encode(side: str, r: int) -> float:
        return timed(lambda: [to_segment(processors[side], *s) for s in states], args.states)

    def reset(side: str, r: int) -> float:
        def run():
            for i in range(args.states):
                if side == "before":  # another maze in between: every reset to `loaded` builds it anew
                    env.reset(options={"layout": other})
                env.reset(options={"layout": {**loaded, "agent": squares[i % len(squares)]}})
        return timed(run, args.states * (2 if side == "before" else 1))

    def path(side: str, r: int) -> float:
        return timed(lambda: [to_segment(processors[side], *s) for s in samplers[side].sample(args.states, seed=r)],
                     args.states)

    works = {"draw": ("drawing states (states/s)", draw), "encode": ("encoding states (states/s)", encode),
             "reset": ("reset to a layout (resets/s)", reset), "path": ("the data path (states/s)", path)}
    rates = {work: {"before": [], "now": []} for work in works}
    for r in range(args.rounds):
        for work, (_, fn) in works.items():
            for side in ("before", "now"):
                rates[work][side].append(fn(side, r))
        done = ", ".join(f"{w} {rates[w]['before'][-1]:.0f} / {rates[w]['now'][-1]:.0f}" for w in works)
        print(f"round {r} (before / now): {done}", flush=True)

    print(f"\n{args.states} states (resets) per side per round, {args.rounds} rounds\n")
    print("| work | before (median) | now (median) | now / before |\n|---|---:|---:|---:|")
    for work, (label, _) in works.items():
        a, b = (statistics.median(rates[work][s]) for s in ("before", "now"))
        print(f"| {label} | {a:.0f} | {b:.0f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
