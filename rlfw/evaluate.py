"""Greedy evaluation on a fixed set of layouts: pass@1 beside the solvable ceiling.

Pass means the episode *succeeded* (the env's `info["success"]`: stopped on the goal), never
"reward > 0". Every evaluation also reports the fraction of the set that can be solved within the
turn limit, so a pass@1 is never read against an impossible 100%. Trajectories are saved as JSONL,
and the first few episodes as captioned GIFs (`rlfw.gifs`); `evaluation_images` gathers those GIFs
and draws the pass@1 curve so far, for the logger to send to TensorBoard and wandb.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np

from rlfw.gifs import TurnNote, write_gif
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


class _TurnRecorder(gym.Wrapper):
    """Keeps what the env said about each turn of the current episode, for the GIF captions."""

    def reset(self, **kwargs):
        self.notes: list[TurnNote] = []
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.notes.append(TurnNote(bool(info.get("invalid_action", False)), bool(info.get("wall_bump", False)),
                                   bool(terminated), bool(truncated)))
        return obs, reward, terminated, truncated, info


def save_episodes(episodes: list[Episode], out_dir: Path, notes: list[list[TurnNote]], max_turns: int) -> None:
    """Every episode as a line of episodes.jsonl; the first len(notes) also as captioned GIFs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "episodes.jsonl", "w") as f:
        for i, e in enumerate(episodes):
            f.write(json.dumps({"index": i, "seed": e.task.seed, "success": e.success, "reward": e.reward,
                                "turns": e.turns, "actions": e.actions}) + "\n")
    for i, (e, turn_notes) in enumerate(zip(episodes, notes)):
        if e.frames:
            write_gif(e, turn_notes, max_turns, out_dir / f"episode_{i:03d}.gif")


def evaluation_images(eval_dir: Path, metrics_path: Path, label: str) -> dict[str, Path]:
    """One evaluation's pictures by logging tag: its GIFs (eval/<set>/episode_i) and the pass@1 curve
    of every set so far, drawn from metrics.jsonl into eval_dir/pass_at_1.png (eval/pass_at_1_plot)."""
    from rlfw.report import pass_at_1_keys, plot

    images = {f"eval/{gif.parent.name}/{gif.stem}": gif for gif in sorted(eval_dir.glob("*/episode_*.gif"))}
    if metrics_path.exists() and pass_at_1_keys(metrics_path):
        images["eval/pass_at_1_plot"] = plot({label: metrics_path}, eval_dir / "pass_at_1.png")
    return images


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
    recorders = [_TurnRecorder(env) for env in envs[:n_gifs if out_dir is not None else 0]]
    envs = recorders + envs[len(recorders):]  # episode i plays envs[i]: the first n_gifs are recorded
    episodes = collect(engine, processor, envs, tasks, 1, params, limits, keep_frames=out_dir is not None)
    metrics = episode_metrics(episodes, f"eval/{name}")
    if layouts is not None:
        metrics[f"eval/{name}/solvable_fraction"] = solvable_fraction(layouts, limits.max_turns)
    if out_dir is not None:
        save_episodes(episodes, out_dir, [r.notes for r in recorders[:len(tasks)]], limits.max_turns)
    return metrics, episodes
