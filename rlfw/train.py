"""The GRPO training loop: rollout -> advantages -> update -> sync -> log -> evaluate.

It receives a `policy` (trainer worker) and an `engine` (one or a pool of rollout engines) from
the runtime, in-process or Ray actors alike, and never imports ray. Variants of GRPO are chosen by
name from `rlfw.algos` (advantage estimator, policy loss, reduction), never by branches here.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from rlfw.algos import get_adv_est, nonconstant_groups
from rlfw.build import eval_tasks, make_env_fn
from rlfw.config import Config
from rlfw.evaluate import episode_metrics, evaluate
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.types import Episode, SamplingParams, Task


class TaskSampler:
    """Training tasks: generator seeds drawn from `envs.eval_sets.TRAIN_SEEDS` (never held-out seeds)."""

    def __init__(self, seed: int, seeds: range):
        self.rng = np.random.default_rng(seed)
        self.seeds = seeds

    def next(self, n: int) -> list[Task]:
        return [Task(seed=int(s)) for s in self.rng.integers(self.seeds.start, self.seeds.stop, size=n)]


def rollout_step(cfg: Config, engine, processor, envs, sampler: TaskSampler, timers: dict) -> tuple[list[Episode], int]:
    """Collect a step's episodes; with dynamic sampling, keep (and top up) informative groups only."""
    a = cfg.algo
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_new_tokens=cfg.env.max_new_tokens)
    limits = limits_of(cfg)
    kept: list[Episode] = []
    rounds = a.max_sample_rounds if a.dynamic_sampling == "resample" else 1
    for r in range(rounds):
        need = a.train_batch_size - len({(e.group_id) for e in kept})
        episodes = collect(engine, processor, envs, sampler.next(need), a.n_samples_per_prompt, params, limits,
                           timers=timers)
        for e in episodes:
            e.group_id += r * a.train_batch_size  # unique across rounds
        if a.dynamic_sampling != "off":
            rewards, groups = _rewards_groups(episodes)
            keep = nonconstant_groups(rewards, groups).tolist()
            episodes = [e for e, k in zip(episodes, keep) if k]
        kept += episodes
        if len({e.group_id for e in kept}) >= a.train_batch_size:
            break
    return kept, r + 1


def _rewards_groups(episodes: list[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([e.reward for e in episodes], dtype=torch.float32),
            torch.tensor([e.group_id for e in episodes], dtype=torch.long))


def limits_of(cfg: Config) -> LoopLimits:
    e = cfg.env
    return LoopLimits(max_turns=e.max_turns, max_new_tokens=e.max_new_tokens,
                      max_episode_tokens=e.max_episode_tokens, history=e.history)


def train(cfg: Config, out_dir: Path, model_path: str, policy, engine, logger) -> dict:
    """Run cfg.trainer.total_steps steps; return the last metrics."""
    from envs.eval_sets import TRAIN_SEEDS

    a, t = cfg.algo, cfg.trainer
    processor = PolicyProcessor.from_pretrained(model_path)
    make_env = make_env_fn(cfg.env)
    tasks, layouts = eval_tasks(cfg.env)
    envs = [make_env() for _ in range(max(a.train_batch_size * a.n_samples_per_prompt, len(tasks)))]
    sampler = TaskSampler(cfg.seed, TRAIN_SEEDS)
    adv_fn = get_adv_est(a.advantage_estimator)
    sync_root = Path(t.lora_sync_path)

    def run_eval(step: int) -> None:
        t0 = time.perf_counter()
        metrics = evaluate(engine, processor, envs, tasks, layouts, limits_of(cfg), cfg.env.name,
                           out_dir / "eval" / f"step_{step:06d}", t.eval_save_episodes)
        metrics["timing/eval"] = time.perf_counter() - t0
        logger.log(step, metrics)
        ceiling = metrics.get(f"eval/{cfg.env.name}/solvable_fraction")
        logger.message(f"step {step}: eval/{cfg.env.name}/pass_at_1={metrics[f'eval/{cfg.env.name}/pass_at_1']:.3f}"
                       + (f" (solvable within {cfg.env.max_turns} turns: {ceiling:.3f})" if ceiling is not None else ""))

    policy.save_weights(str(sync_root), 0)  # engines start from exactly the trainer's weights
    engine.load_weights(str(sync_root))
    if t.eval_interval and t.eval_before_train:
        run_eval(0)
    for step in range(1, t.total_steps + 1):
        t_step = time.perf_counter()
        timers: dict[str, float] = {}
        episodes, rounds = rollout_step(cfg, engine, processor, envs, sampler, timers)
        metrics = {f"train/{k.split('/', 1)[1]}": v for k, v in episode_metrics(episodes, "x").items()} if episodes else {}
        metrics["train/sample_rounds"] = rounds
        if episodes:
            rewards, groups = _rewards_groups(episodes)
            adv = adv_fn(rewards, groups)
            segments, seg_adv, seg_groups = [], [], []
            for e, a_i in zip(episodes, adv.tolist()):
                for s in e.segments:
                    segments.append(s)
                    seg_adv.append(a_i)
                    seg_groups.append(e.group_id)
            t0 = time.perf_counter()
            engine.sleep()
            stats = policy.update(segments, seg_adv, seg_groups)
            engine.wake_up()
            t1 = time.perf_counter()
            policy.save_weights(str(sync_root), step)
            versions = engine.load_weights(str(sync_root))
            t2 = time.perf_counter()
            metrics["policy/engine_weights_version"] = min(versions)
            metrics.update({f"policy/{k}": v for k, v in stats.items()})
            metrics.update({"train/reward_mean": float(rewards.mean()), "train/success_rate": metrics.pop("train/pass_at_1"),
                            "train/advantage_abs_mean": float(adv.abs().mean()),
                            "train/episodes": len(episodes), "train/segments": len(segments),
                            "train/generated_tokens": sum(e.generated_tokens for e in episodes),
                            "timing/train": t1 - t0, "timing/sync": t2 - t1})
        metrics.update({f"timing/{k}": v for k, v in timers.items()})
        metrics["timing/step"] = time.perf_counter() - t_step
        logger.log(step, metrics)
        if t.eval_interval and (step % t.eval_interval == 0 or step == t.total_steps):
            run_eval(step)
        logger.progress(step)
    return dict(logger.last)
