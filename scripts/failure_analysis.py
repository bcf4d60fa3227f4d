"""Where a maze policy goes wrong: replay a run's saved greedy evaluation episodes against the oracle.

    python scripts/failure_analysis.py runs/<run>                 # first and last evaluation
    python scripts/failure_analysis.py runs/<run> --steps 0 120

For each evaluation set it prints pass@1; the error rate of the first wrong move, per kind of square
(corridor: two open neighbours, junction: three or four, dead end: one), counted along each episode
until its first wrong move; how often an episode recovers after a wrong move; and how failures end
(stopped off the target, stuck bumping into a wall, looping over the same squares, out of turns).
A wrong move is any action other than the env's BFS-best one (`best_action()`); in a perfect maze
that route is unique. Works for envs built on envs.gridnav.GridNavEnv.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from envs.actions import DELTAS, STOP, parse_action
from envs.layout import parse_layout
from rlfw.build import eval_tasks, make_env_fn
from rlfw.config import register_configs, repo_root

KINDS = ("corridor", "junction", "dead_end", "on_target")


def square_kind(walls, agent) -> str:
    """corridor (two open neighbours), junction (three or four) or dead_end (one)."""
    (r, c), (h, w) = agent, walls.shape
    open_ = sum(0 <= r + dr < h and 0 <= c + dc < w and not walls[r + dr, c + dc] for dr, dc in DELTAS)
    return "junction" if open_ >= 3 else "dead_end" if open_ == 1 else "corridor"


def analyse(env, tasks, episodes: list[dict]) -> dict:
    at_risk, first_wrong, ends = Counter(), Counter(), Counter()
    with_error = recovered = 0
    for ep in episodes:
        task = tasks[ep["index"]]
        info = env.reset(seed=task.seed, options={"layout": task.layout} if task.layout else None)[1]
        walls = parse_layout(env.layout())[0]
        visits, bumps, wrong = Counter(), 0, False
        for text in ep["actions"]:  # the policy's generated text, as the env received it
            best = env.action_strings.index(env.best_action())
            if not wrong:
                kind = "on_target" if best == STOP else square_kind(walls, info["agent"])
                at_risk[kind] += 1
                if parse_action(text, env.action_format) != best:
                    wrong = True
                    first_wrong[kind] += 1
            visits[info["agent"]] += 1
            info = env.step(text)[-1]
            bumps = bumps + 1 if info["wall_bump"] else 0
        with_error += wrong
        recovered += wrong and ep["success"]
        if not ep["success"]:
            stopped = bool(ep["actions"]) and parse_action(ep["actions"][-1], env.action_format) == STOP
            ends["stopped off target" if stopped else "stuck bumping a wall" if bumps >= 3
                 else "looping" if max(visits.values()) >= 3 else "out of turns"] += 1
    return {"episodes": len(episodes), "solved": sum(ep["success"] for ep in episodes),
            "error_rate": {k: (first_wrong[k], at_risk[k]) for k in KINDS if at_risk[k]},
            "with_error": with_error, "recovered": recovered, "failures": dict(ends)}


def report(name: str, step: int, r: dict) -> str:
    lines = [f"step {step} {name}: pass@1 {r['solved']}/{r['episodes']} = {r['solved'] / r['episodes']:.3f}"]
    rates = ", ".join(f"{k} {w / n:.3f} ({w}/{n})" for k, (w, n) in r["error_rate"].items())
    lines.append(f"  first wrong move, per square until then: {rates}")
    lines.append(f"  episodes with a wrong move: {r['with_error']}, of which solved anyway: {r['recovered']}")
    lines.append(f"  failures end: {r['failures']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="an rlfw.run or rlfw.sft run folder (.hydra/ and eval/step_N/<set>/)")
    ap.add_argument("--steps", type=int, nargs="*", help="evaluation steps (default: the first and the last)")
    args = ap.parse_args()
    register_configs()
    job = OmegaConf.load(args.run / ".hydra" / "hydra.yaml").hydra.job  # rlfw.run's or rlfw.sft's
    overrides = [o for o in OmegaConf.load(args.run / ".hydra" / "overrides.yaml") if not o.startswith("hydra.")]
    with initialize_config_dir(config_dir=repo_root() + "/conf", version_base="1.3"):
        env_cfg = OmegaConf.to_object(compose(job.config_name, overrides=overrides).env)
    env = make_env_fn(env_cfg)().unwrapped
    saved = sorted(int(p.name.split("_")[1]) for p in (args.run / "eval").glob("step_*"))
    if not saved:
        raise SystemExit(f"no evaluation episodes under {args.run / 'eval'} (trainer.eval_save_episodes)")
    for step in args.steps or sorted({saved[0], saved[-1]}):
        for folder in sorted((args.run / "eval" / f"step_{step:06d}").glob("*/episodes.jsonl")):
            name = folder.parent.name
            episodes = [json.loads(line) for line in folder.read_text().splitlines()]
            tasks, _ = eval_tasks(env_cfg, "heldout", len(episodes)) if name == "heldout" else eval_tasks(env_cfg)
            print(report(name, step, analyse(env, tasks, episodes)))


if __name__ == "__main__":
    main()
