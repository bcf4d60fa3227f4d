"""Greedy evaluation on a fixed set of layouts: pass@1 beside the solvable ceiling.

Pass means the episode *succeeded* (the env's `info["success"]`: stopped on the goal), never
"reward > 0". Every evaluation also reports the fraction of the set that can be solved within the
turn limit, so a pass@1 is never read against an impossible 100%. Trajectories are saved as JSONL,
and the first few episodes as GIFs.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np

from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.engine import InferenceEngine
from rlfw.rollout.types import Episode, SamplingParams, Task


def episode_metrics(episodes: list[Episode], prefix: str) -> dict[str, float]:
    turns = sum(e.turns for e in episodes)
    return {
        f"{prefix}/pass_at_1": float(np.mean([e.success for e in episodes])),
        f"{prefix}/reward_mean": float(np.mean([e.reward for e in episodes])),
        f"{prefix}/turns_mean": float(np.mean([e.turns for e in episodes])),
        f"{prefix}/invalid_action_rate": sum(e.invalid_actions for e in episodes) / max(turns, 1),
        f"{prefix}/wall_bump_rate": sum(e.wall_bumps for e in episodes) / max(turns, 1),
    }


def save_episodes(episodes: list[Episode], out_dir: Path, n_gifs: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "episodes.jsonl", "w") as f:
        for i, e in enumerate(episodes):
            f.write(json.dumps({"index": i, "seed": e.task.seed, "success": e.success, "reward": e.reward,
                                "turns": e.turns, "actions": e.actions}) + "\n")
    from PIL import Image

    for i, e in enumerate(episodes[:n_gifs]):
        if not e.frames:
            continue
        scale = max(1, 128 // e.frames[0].shape[0])
        frames = [Image.fromarray(np.kron(f, np.ones((scale, scale, 1), dtype=np.uint8))) for f in e.frames]
        frames[0].save(out_dir / f"episode_{i:03d}.gif", save_all=True, append_images=frames[1:], duration=400, loop=0)


def evaluate(
    engine: InferenceEngine,
    processor: PolicyProcessor,
    envs: list[gym.Env],
    tasks: list[Task],
    layouts: list[dict] | None,
    limits: LoopLimits,
    name: str,
    out_dir: Path | None = None,
    n_gifs: int = 4,
) -> tuple[dict[str, float], list[Episode]]:
    """Greedy pass@1 of one episode per task, metrics under eval/<name>/; returns them and the episodes.

    With `layouts` (fixed sets), also the fraction solvable within the turn limit.
    """
    from envs.eval_sets import solvable_fraction

    params = SamplingParams(max_new_tokens=limits.max_new_tokens, greedy=True)
    episodes = collect(engine, processor, envs, tasks, 1, params, limits, keep_frames=out_dir is not None)
    metrics = episode_metrics(episodes, f"eval/{name}")
    if layouts is not None:
        metrics[f"eval/{name}/solvable_fraction"] = solvable_fraction(layouts, limits.max_turns)
    if out_dir is not None:
        save_episodes(episodes, out_dir, n_gifs)
    return metrics, episodes
