"""The GRPO training loop: rollout -> advantages -> update -> sync -> log -> evaluate -> checkpoint.

It receives a `policy` (trainer worker) and an `engine` (one or a pool of rollout engines) from
the runtime, in-process or Ray actors alike, and never imports ray. Variants of GRPO are chosen by
name from `rlfw.algos` (advantage estimator, policy loss, reduction), never by branches here.

Step N's rollouts are a pure function of (seed, N, current weights): its tasks and the engines'
sampling seed are derived from (seed, N), so a run resumed from a checkpoint repeats exactly what
the uninterrupted run would have done. With restarts (`algo.restart_fraction`) some of step N's
tasks come from a buffer of earlier steps' first wrong moves (`rlfw.rollout.restarts`), which the
checkpoint holds, so the same holds with the buffer added to that state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from rlfw import checkpoint
from rlfw.algos import get_adv_est, nonconstant_groups, step_advantages
from rlfw.build import eval_tasks, make_env_fn, training_filter
from rlfw.config import AlgoConfig, Config
from rlfw.evaluate import episode_metrics, evaluate, evaluation_images
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.demos import DemoSampler, to_segment
from rlfw.rollout.engine import EngineFailure
from rlfw.rollout.oracle import oracle_metrics, oracle_targets, oracle_weights
from rlfw.rollout.restarts import StartStates
from rlfw.rollout.types import Episode, Prompt, SamplingParams, Segment, Task, TrainBatch, prompt_key
from rlfw.signals import raise_if_signalled


def step_seed(seed: int, step: int, round_: int = 0) -> int:
    """A 31-bit seed for (run seed, step, sampling round)."""
    return int(np.random.default_rng([seed, step, round_]).integers(2**31))


def training_tasks(seed: int, step: int, round_: int, n: int,
                   allowed: Callable[[int], bool] | None = None) -> list[Task]:
    """Step `step`'s tasks: generator seeds drawn from envs.eval_sets.TRAIN_SEEDS (never held-out
    seeds); a seed whose layout `allowed` rejects (an evaluation maze) is replaced by a fresh draw."""
    from envs.eval_sets import TRAIN_SEEDS

    rng = np.random.default_rng([seed, step, round_, 1])
    seeds = []
    for s in rng.integers(TRAIN_SEEDS.start, TRAIN_SEEDS.stop, size=n).tolist():
        while allowed is not None and not allowed(s):
            s = int(rng.integers(TRAIN_SEEDS.start, TRAIN_SEEDS.stop))
        seeds.append(s)
    return [Task(seed=s) for s in seeds]


def limits_of(cfg: Config) -> LoopLimits:
    e, a = cfg.env, cfg.algo
    return LoopLimits(max_turns=e.max_turns, max_new_tokens=e.max_new_tokens,
                      max_episode_tokens=e.max_episode_tokens, history=e.history,
                      oracle=a.oracle_coef > 0 or a.restart_fraction > 0)  # labels only where a lever reads them


def start_states(cfg: Config, make_env, allowed: Callable[[int], bool] | None = None) -> StartStates:
    """Where the run's groups start: `training_tasks`, and restarts as `algo.restart_fraction` says."""
    a = cfg.algo
    return StartStates(lambda step, r, n: training_tasks(cfg.seed, step, r, n, allowed), make_env, cfg.seed,
                       a.restart_fraction, a.restart_buffer_size, cfg.env.max_turns)


def rollout_step(cfg: Config, step: int, engine, processor, envs, timers: dict,
                 allowed: Callable[[int], bool] | None = None,
                 starts: StartStates | None = None) -> tuple[list[Episode], int]:
    """Collect a step's episodes; with dynamic sampling, keep (and top up) informative groups only.
    Tasks come from `starts` (default: fresh training tasks only), which then records the first
    wrong moves of every episode collected, kept or not."""
    a = cfg.algo
    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_new_tokens=cfg.env.max_new_tokens)
    starts = starts or StartStates(lambda step_, r, n: training_tasks(cfg.seed, step_, r, n, allowed))
    kept, collected = [], []
    rounds = a.max_sample_rounds if a.dynamic_sampling == "resample" else 1
    for r in range(rounds):
        need = a.tasks_per_step - len({e.group_id for e in kept})
        engine.set_seed(step_seed(cfg.seed, step, r))
        tasks = starts.tasks(step, r, need)
        episodes = collect(engine, processor, envs, tasks, a.n_samples_per_prompt, params, limits_of(cfg),
                           timers=timers)
        collected += episodes
        for e in episodes:
            e.group_id += r * a.tasks_per_step  # unique across rounds
        if a.dynamic_sampling != "off":
            rewards, groups = rewards_and_groups(episodes)
            episodes = [e for e, k in zip(episodes, nonconstant_groups(rewards, groups).tolist()) if k]
        kept += episodes
        if len({e.group_id for e in kept}) >= a.tasks_per_step:
            break
    starts.record(collected)  # once all rounds succeeded: a step redone after an engine failure records once
    return kept, r + 1


def rewards_and_groups(episodes: list[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([e.reward for e in episodes], dtype=torch.float32),  # [N]
            torch.tensor([e.group_id for e in episodes], dtype=torch.long))  # [N]


def train_batch(episodes: list[Episode], advantages: torch.Tensor, algo: AlgoConfig,
                processor: PolicyProcessor | None = None, fresh: list[Segment] = ()) -> TrainBatch:
    """Every segment of every episode, with its advantage and group: the episode's advantage, plus
    `algo.step_advantage_weight` times the GiGPO step-level advantage of the turn when it is on
    (normalised by the same estimator as the episode's); with `algo.oracle_coef > 0`, the oracle
    segments of the turns `algo.oracle_states` chooses and of the visited states of the kinds
    `algo.oracle_tag_states` names (`rlfw.rollout.oracle`; needs `processor`),
    weighted by their state tags (`algo.oracle_tag_weights`; a label weighed 0 is left out, as it would
    add nothing to the weighted mean but its forward pass), then the `fresh` oracle segments
    (`algo.oracle_fresh_states`, weight 1), dealt to the groups in turn."""
    batch = TrainBatch([], [], [])
    for e, a in zip(episodes, advantages.tolist()):
        batch.segments += e.segments
        batch.advantages += [a] * len(e.segments)
        batch.groups += [e.group_id] * len(e.segments)
    if algo.step_advantage_weight > 0:
        step = step_advantages(*turn_returns(episodes, algo.step_gamma), get_adv_est(algo.advantage_estimator))
        batch.advantages = [a + algo.step_advantage_weight * s for a, s in zip(batch.advantages, step.tolist())]
    if algo.oracle_coef > 0:
        segments, label_groups, tags = oracle_targets(episodes, processor, algo.oracle_states,
                                                      algo.oracle_tag_states)
        weights = oracle_weights(tags, algo.oracle_tag_weights)
        kept = [k for k, w in enumerate(weights) if w > 0]
        batch.oracle = [segments[k] for k in kept]
        batch.oracle_groups = [label_groups[k] for k in kept]
        batch.oracle_weights = [weights[k] for k in kept]
        groups = sorted({e.group_id for e in episodes})
        batch.oracle += fresh
        batch.oracle_groups += [groups[i % len(groups)] for i in range(len(fresh))]
        batch.oracle_weights += [1.0] * len(fresh)
    return batch


def fresh_sampler(algo: AlgoConfig, make_env, seed: int, allowed) -> DemoSampler | None:
    """The sampler of `algo.oracle_fresh_states` (None when off): all_squares states of training mazes
    that `allowed` admits, `algo.oracle_fresh_junction_fraction` of them at junctions."""
    if not algo.oracle_fresh_states:
        return None
    return DemoSampler(make_env, seed, "all_squares", 0.0, allowed, algo.oracle_fresh_junction_fraction)


def fresh_segments(demos: DemoSampler | None, processor: PolicyProcessor, n: int, seed: int) -> list[Segment]:
    """`algo.oracle_fresh_states`: `n` oracle-labelled states of fresh training mazes, drawn from `seed`."""
    return [to_segment(processor, *state) for state in demos.sample(n, seed)] if demos else []


def turn_returns(episodes: list[Episode], gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each turn's discounted return-to-go [M] (the outcome reward, gamma**k for a turn k turns before
    the end) and its anchor id [M]: turns of one group with the same observation share an anchor."""
    anchors: dict[tuple, int] = {}
    returns, ids = [], []
    for e in episodes:
        for t, seg in enumerate(e.segments):
            returns.append(e.reward * gamma ** (len(e.segments) - 1 - t))
            prompt = seg.token_ids[: seg.loss_mask.index(1)] if 1 in seg.loss_mask else seg.token_ids
            key = (e.group_id, prompt_key(Prompt(prompt, seg.images)))
            ids.append(anchors.setdefault(key, len(anchors)))
    return torch.tensor(returns, dtype=torch.float32), torch.tensor(ids, dtype=torch.long)


def resume(cfg: Config, store: checkpoint.CheckpointStore, policy, logger) -> tuple[int, dict]:
    """Load the checkpoint resume_mode asks for; return the step to continue after (0 = fresh) and its
    trainer state ({} when fresh): `elapsed_min`, the run's wall time up to that checkpoint (work lost
    after it is not counted), and `restarts`, the restart buffer."""
    t = cfg.trainer
    if t.resume_mode == "none":
        return 0, {}
    found = store.resolve(t.resume_path) if t.resume_mode == "from_path" else store.find_resume(logger.message)
    if found is None:
        logger.message(f"resume_mode=latest: no valid checkpoint under {t.ckpt_path}; starting fresh")
        logger.truncate_after(-1)  # whatever an earlier attempt logged here is not part of this run
        return 0, {}
    return found.step, checkpoint.load_resumed(store, found, cfg, policy, logger, t.resume_ignore_config_changes)


def train(cfg: Config, out_dir: Path, model_path: str, policy, engine, logger) -> dict:
    """Run (or continue) to cfg.trainer.total_steps; return the last metrics."""
    a, t = cfg.algo, cfg.trainer
    processor = PolicyProcessor.from_pretrained(model_path)
    make_env = make_env_fn(cfg.env, processor.crop_px)  # the observations the policy was trained on
    adv_fn = get_adv_est(a.advantage_estimator)
    sync_root = Path(t.lora_sync_path)

    sets = {cfg.env.name: eval_tasks(cfg.env)}
    heldout = eval_tasks(cfg.env, "heldout", t.heldout_eval_size) if t.heldout_eval_size else None
    # never train on a maze this run (or any rlfw run) evaluates on
    heldout_used = max(t.heldout_eval_size, cfg.env.eval_size if cfg.env.eval_set == "heldout" else 0)
    allowed = training_filter(cfg.env, heldout_used)
    envs = [make_env() for _ in range(max(a.tasks_per_step * a.n_samples_per_prompt,
                                          *(len(tasks) for tasks, _ in [*sets.values(), heldout or ([], None)])))]

    last = t.total_steps  # the final step: total_steps, or the one that ends past trainer.max_minutes

    def run_eval(step: int) -> None:
        t0 = time.perf_counter()
        chosen = dict(sets)
        if heldout and (step == 0 or step == last):
            chosen["heldout"] = heldout
        metrics, every_time = {}, []
        for name, (tasks, layouts) in chosen.items():
            m, episodes = evaluate(engine, processor, envs, tasks, layouts, limits_of(cfg), name,
                                   out_dir / "eval" / f"step_{step:06d}" / name, t.eval_save_episodes)
            metrics.update(m)
            every_time += episodes if name in sets else []
        # eval/all: the sets evaluated at every evaluation, so it means the same at every step
        metrics.update(episode_metrics(every_time, "eval/all"))
        metrics["timing/eval"] = time.perf_counter() - t0
        metrics["timing/elapsed_min"] = elapsed_min()
        logger.log(step, metrics)
        logger.log_images(step, evaluation_images(out_dir / "eval" / f"step_{step:06d}",
                                                  out_dir / "metrics.jsonl", a.name))
        for name, (_, layouts) in chosen.items():
            ceiling = metrics.get(f"eval/{name}/solvable_fraction")
            logger.message(f"step {step}: eval/{name}/pass_at_1={metrics[f'eval/{name}/pass_at_1']:.3f}"
                           + (f" (solvable within {cfg.env.max_turns} turns: {ceiling:.3f})" if ceiling is not None else ""))

    store = checkpoint.CheckpointStore(t.ckpt_path, t.ckpt_storage_options)
    exports = checkpoint.ExportStore(t.export_path, t.ckpt_storage_options)
    start, state = resume(cfg, store, policy, logger)
    started = time.perf_counter() - 60 * state.get("elapsed_min", 0.0)  # timing/elapsed_min runs on across resumes
    starts = start_states(cfg, make_env, allowed)
    demos = fresh_sampler(a, make_env, cfg.seed, allowed)
    starts.load_state_dict(state.get("restarts"))

    def elapsed_min() -> float:
        return (time.perf_counter() - started) / 60

    policy.save_weights(str(sync_root), start)  # engines start from exactly the trainer's weights
    engine.load_weights(str(sync_root))
    if t.eval_interval and t.eval_before_train and start == 0:
        run_eval(0)
    logger.progress(start)
    for step in range(start + 1, t.total_steps + 1):
        raise_if_signalled()  # a Ctrl-C or SIGTERM whose exception something swallowed (see rlfw.signals)
        t_step, timers = time.perf_counter(), {}
        for attempt in range(cfg.cluster.max_engine_restarts + 1):
            try:
                episodes, rounds = rollout_step(cfg, step, engine, processor, envs, timers, allowed, starts)
                break
            except EngineFailure as exc:
                if attempt == cfg.cluster.max_engine_restarts:
                    raise
                logger.message(f"step {step}: {exc}; redoing this step's rollouts (retry {attempt + 1})")
                engine.recover(str(sync_root))
        metrics = {"train/sample_rounds": rounds, **starts.metrics(episodes)}
        if episodes:
            rewards, groups = rewards_and_groups(episodes)
            adv = adv_fn(rewards, groups)
            t0 = time.perf_counter()
            engine.sleep()
            progress = elapsed_min() / t.max_minutes if t.schedule == "minutes" else None  # the LR on wall time
            done = progress if progress is not None else (step - 1) / t.total_steps
            n_fresh = a.oracle_fresh_states if done >= a.oracle_fresh_from else 0
            fresh = fresh_segments(demos, processor, n_fresh, step_seed(cfg.seed, step, 98))
            batch = train_batch(episodes, adv, cfg.algo, processor, fresh)
            stats = policy.update(batch, step, seed=step_seed(cfg.seed, step, 99), lr_progress=progress)
            engine.wake_up()
            if stats["nonfinite"] or not np.isfinite(stats.get("loss", 0.0)):  # before anything is published
                raise FloatingPointError(
                    f"step {step}: the policy loss or its gradient is not finite (loss {stats.get('loss')}, "
                    f"oracle loss {stats.get('oracle_loss')}, grad norm "
                    f"{stats['grad_norm']}); nothing of this step was published. Lower algo.lr or algo.max_grad_norm, "
                    "or resume from an earlier checkpoint")
            t1 = time.perf_counter()
            policy.save_weights(str(sync_root), step)
            metrics["policy/engine_weights_version"] = min(engine.load_weights(str(sync_root)))
            metrics.update({f"policy/{k}": v for k, v in stats.items()})
            metrics.update(episode_metrics(episodes, "train"))
            metrics.update(oracle_metrics(episodes, len(batch.oracle)))
            if fresh:
                metrics["train/oracle_fresh_states"] = len(fresh)
            if cfg.algo.oracle_tag_weights and batch.oracle_weights:
                metrics["train/oracle_weight_mean"] = float(np.mean(batch.oracle_weights))
            metrics.update({"train/success_rate": metrics.pop("train/pass_at_1"),
                            "train/advantage_abs_mean": float(adv.abs().mean()), "train/episodes": len(episodes),
                            "train/generated_tokens": sum(e.generated_tokens for e in episodes),
                            "timing/train": t1 - t0, "timing/sync": time.perf_counter() - t1})
        metrics.update({f"timing/{k}": v for k, v in timers.items()})
        metrics["timing/step"] = time.perf_counter() - t_step
        metrics["memory/trainer_peak_rss_mb"] = policy.peak_rss_mb()
        metrics["memory/engine_peak_rss_mb"] = max(engine.peak_rss_mb())
        logger.log(step, metrics)
        if t.max_minutes is not None and elapsed_min() >= t.max_minutes and step < last:
            logger.message(f"step {step}: {elapsed_min():.1f} min, past trainer.max_minutes={t.max_minutes}; "
                           "this step is the last")
            last = step
        if t.eval_interval and (step % t.eval_interval == 0 or step == last):
            run_eval(step)
        if t.ckpt_interval and (step % t.ckpt_interval == 0 or step == last):
            t0 = time.perf_counter()
            store.save(step, policy, cfg, t.max_ckpts_to_keep, elapsed_min(), {"restarts": starts.state_dict()})
            logger.log(step, {"timing/checkpoint": time.perf_counter() - t0})
        if t.hf_save_interval and (step % t.hf_save_interval == 0 or step == last):
            exports.save(step, policy, t.max_exports_to_keep)
        logger.progress(step)
        if step == last:
            break
    return dict(logger.last)
