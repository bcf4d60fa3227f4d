"""Greedy evaluation on a fixed set of layouts: pass@1 beside the solvable ceiling.

Pass means the episode *succeeded* (the env's `info["success"]`: stopped on the goal), never
"reward > 0". Every evaluation also reports the fraction of the set that can be solved within the
turn limit, so a pass@1 is never read against an impossible 100%. Trajectories are saved as JSONL,
and the first few episodes as captioned GIFs (`rlfw.gifs`); `evaluation_images` gathers those GIFs
and draws the pass@1 curve so far, for the logger to send to TensorBoard and wandb. `play` and
`pass_at_k` serve `python -m rlfw.eval`, which can also sample several episodes per task.
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


def pass_at_k(successes: np.ndarray, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) of successes [tasks, n] (n >= k samples per task): the mean
    over tasks of 1 - C(n - c, k) / C(n, k), c the task's successes. k = n is the fraction of tasks
    with at least one success; k = 1 the mean success."""
    from math import comb

    n = successes.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {n} samples per task")
    return float(np.mean([1 - comb(n - int(c), k) / comb(n, k) for c in successes.sum(axis=1)]))


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

    episodes, notes = play(engine, processor, envs, tasks, limits, n_recorded=n_gifs if out_dir is not None else 0,
                           keep_frames=out_dir is not None)
    metrics = episode_metrics(episodes, f"eval/{name}")
    if layouts is not None:
        metrics[f"eval/{name}/solvable_fraction"] = solvable_fraction(layouts, limits.max_turns)
    if out_dir is not None:
        save_episodes(episodes, out_dir, notes, limits.max_turns)
    return metrics, episodes


def play(
    engine: InferenceEngine,
    processor: PolicyProcessor,
    envs: list[gym.Env],
    tasks: list[Task],
    limits: LoopLimits,
    params: SamplingParams | None = None,
    n_samples: int = 1,
    n_recorded: int = 0,
    keep_frames: bool = False,
) -> tuple[list[Episode], list[list[TurnNote]]]:
    """`n_samples` episodes of every task (greedy unless `params` say otherwise), episode i on envs[i];
    also the turn notes of the first `n_recorded` episodes, for their GIFs (with `keep_frames`)."""
    params = params or SamplingParams(max_new_tokens=limits.max_new_tokens, greedy=True)
    recorders = [_TurnRecorder(env) for env in envs[:n_recorded]]
    envs = recorders + envs[len(recorders):]  # episode i plays envs[i]: the first n_recorded are recorded
    episodes = collect(engine, processor, envs, tasks, n_samples, params, limits, keep_frames=keep_frames)
    return episodes, [r.notes for r in recorders[:len(episodes)]]
