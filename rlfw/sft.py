"""Supervised fine-tuning on oracle demonstrations: `python -m rlfw.sft env=maze`.

Each training example is one turn in exactly the format the RL rollout uses with `history=none`
(the user turn built by `rlfw.rollout.agent_loop.turn_message`: current image, task prompt, last
step's feedback), followed by the oracle's action and `<|im_end|>`; only those two tokens carry
loss. Demonstrations come from fresh training mazes (seeds in `envs.eval_sets.TRAIN_SEEDS`), never
an evaluation maze (`rlfw.build.training_filter`). Evaluation is greedy pass@1 on held-out mazes
and on `eval64`, through the same `rlfw.evaluate` as RL. The result is a Hugging Face style folder
(model, tokenizer, image processor) that `model.path=` accepts. The run's state is saved every
sft.ckpt_interval steps, so a killed run continues where it was (sft.resume_mode=latest).

    python -m rlfw.sft                                   # to convergence (sft.steps)
    python -m rlfw.sft sft.stop_at_pass_at_1=0.45        # an early checkpoint for GRPO to refine
    python -m rlfw.sft sft.output_dir=<dir> sft.resume_mode=latest   # continue a killed run
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import fields
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from rlfw.checkpoint import CheckpointStore, load_resumed
from rlfw.config import Config, SFTConfig, SFTRunConfig, register_configs, rl_start_model, sft_stage_config
from rlfw.validation import validate_sft
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits
from rlfw.rollout.demos import DemoSampler, to_segment
from rlfw.rollout.types import Segment
from rlfw.schedule import lr_factor, lr_factor_by_time
from rlfw.signals import describe_stop, raise_if_signalled, sigterm_raises, stop_cause
from rlfw.storage import load_state, save_state

register_configs()

TRAIN_STATE = "train_state"  # the resumable state under output_dir (SFTConfig.ckpt_interval)
# What a resumed run reports when it differs from the state it continues (the model's keys are refused).
CONTINUATION_KEYS = ("env", "seed", *(f"sft.{f.name}" for f in fields(SFTConfig)
                                      if f.name not in ("ckpt_interval", "resume_mode", "output_dir", "torch_threads")))


def sft_loss(model, processor: PolicyProcessor, segments: list[Segment], autocast: str | None = None):
    """Mean negative log-likelihood of the supervised (assistant) tokens; also the log-probs [B, T-1]
    and loss mask [B, T-1] it came from. `autocast`: model.train_autocast."""
    from rlfw.policy import sequence_logprobs

    logp, mask, _ = sequence_logprobs(model, processor, segments, autocast=autocast)
    return -(logp * mask).sum() / mask.sum(), logp, mask


def save_checkpoint(model, processor: PolicyProcessor, path: Path, info: dict) -> None:
    """An SFT checkpoint: a model folder (LoRA merged into a copy) with its record in rlfw_sft.json,
    written whole or not at all, so a crash never leaves half a checkpoint."""
    from rlfw.models import save_model_folder

    save_model_folder(model, processor, path, "rlfw_sft.json", info)


class _Resumable:
    """What CheckpointStore saves of an SFT run as its policy state (the driver's RNG, the step, the
    wall time so far and the last evaluation's metrics go into its trainer state): the weights, AdamW,
    the LR schedule and the demonstration stream's position."""

    def __init__(self, **parts):
        self.parts = parts  # each with state_dict() and load_state_dict()

    def save_checkpoint(self, url: str, storage_options: dict) -> dict:
        return save_state(url, {name: part.state_dict() for name, part in self.parts.items()}, storage_options)

    def load_checkpoint(self, url: str, storage_options: dict) -> None:
        state = load_state(url, storage_options)
        for name, part in self.parts.items():
            part.load_state_dict(state[name])


def _resume(cfg: SFTRunConfig, store: CheckpointStore, resumable: _Resumable, logger) -> tuple[int, dict]:
    """With sft.resume_mode=latest, load the newest valid state under train_state/; the step to
    continue after (0: fresh) and its trainer state ({} when fresh)."""
    if cfg.sft.resume_mode == "none":
        return 0, {}
    found = store.find_resume(logger.message)
    if found is None:
        logger.message(f"sft.resume_mode=latest: no saved state under {store.url}; starting fresh")
        logger.truncate_after(-1)  # whatever an earlier attempt logged here is not part of this run
        return 0, {}
    return found.step, load_resumed(store, found, cfg, resumable, logger, continuation_keys=CONTINUATION_KEYS,
                                    way_out="set sft.resume_mode=none to start over")


def run_sft(cfg: SFTRunConfig, command: str | None = None, resume_args: str | None = None) -> dict:
    """Fine-tune, evaluate every sft.eval_interval steps, write the checkpoint; return the last metrics.
    `command`: what the checkpoint records as its command (default: this process's rlfw.sft one);
    `resume_args`: what a stopped run tells the user to rerun with (default: sft.output_dir and
    sft.resume_mode=latest)."""
    from rlfw.config_io import save_run_config
    from rlfw.build import (build_policy_model, eval_tasks, make_env_fn, prepare_base_model, seed_everything,
                            training_filter)
    from rlfw.evaluate import evaluate
    from rlfw.logging import MetricLogger
    from rlfw.models import compile_language_model, resolve_train_autocast
    from rlfw.rollout.engine import TransformersEngine

    validate_sft(cfg)
    s = cfg.sft
    torch.set_num_threads(s.torch_threads)
    out_dir = Path(s.output_dir)
    final = out_dir / "checkpoint"
    if s.resume_mode == "latest" and final.exists():  # written whole or not at all: a finished run
        print(f"rlfw.sft: {final} is already written; nothing to resume", flush=True)
        return {k: v for k, v in json.loads((final / "rlfw_sft.json").read_text()).items() if k.startswith("eval/")}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_run_config(cfg, out_dir)
    seed_everything(cfg.seed)
    path = prepare_base_model(cfg.model, make_env_fn(cfg.env), out_dir, cfg.seed)
    model, processor = build_policy_model(cfg.model, path)
    make_env = make_env_fn(cfg.env, processor.crop_px)  # demonstrations in the policy's observations
    autocast = resolve_train_autocast(cfg.model.train_autocast)  # the SFT process trains on the CPU
    if cfg.model.compile if s.compile is None else s.compile:
        compile_language_model(model)  # the training forward; evaluation below generates under force_eager
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)
    sampler = DemoSampler(make_env, cfg.seed, s.states, s.noise, training_filter(cfg.env, s.eval_size),
                          s.junction_fraction)
    limits = LoopLimits(max_turns=cfg.env.max_turns, max_new_tokens=cfg.env.max_new_tokens,
                        max_episode_tokens=cfg.env.max_episode_tokens, history="none")
    sets = {cfg.env.eval_set: eval_tasks(cfg.env), "heldout": eval_tasks(cfg.env, "heldout", s.eval_size)}
    envs = [make_env() for _ in range(max(len(t) for t, _ in sets.values()))]
    engine = TransformersEngine(model, processor, merge_lora=False,  # evaluates the model being trained
                                autocast=cfg.model.engine_autocast)
    logger = MetricLogger(cfg.logger, out_dir, total_steps=s.steps if s.schedule == "steps" else None, run_config=cfg)
    command = command or "python -m rlfw.sft " + " ".join(_overrides())
    if cfg.model.train_autocast == "auto":
        logger.message(f"model.train_autocast=auto: {'bfloat16 autocast' if autocast else 'float32, no native bf16 here'}")
    started = time.perf_counter()
    decay_steps = int(s.steps * s.decay_fraction)

    def factor(i: int) -> float:
        if s.schedule == "minutes":  # the cosine spans the wall-time budget, whatever the machine's speed
            progress = (time.perf_counter() - started) / (60 * s.max_minutes)
            return lr_factor_by_time(i, progress, s.warmup_steps, s.decay_fraction)
        return lr_factor(i, s.steps, s.warmup_steps, decay_steps)

    if s.schedule == "minutes":
        logger.message(f"sft.schedule=minutes: the LR schedule spans {s.max_minutes} min; sft.steps={s.steps} is a cap")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def run_eval(step: int) -> dict:
        metrics = {}
        with torch.compiler.set_stance("force_eager"):  # model.compile is for training; generate eagerly
            for name, (tasks, layouts) in sets.items():
                metrics.update(evaluate(engine, processor, envs, tasks, layouts, limits, name,
                                        out_dir / "eval" / f"step_{step:06d}" / name, n_gifs=2)[0])
        metrics["timing/elapsed_min"] = (time.perf_counter() - started) / 60
        logger.log(step, metrics)
        model.train()
        info = {"step": step, "seed": cfg.seed, "command": command, **metrics}
        save_checkpoint(model, processor, out_dir / "snapshots" / f"step_{step:06d}", info)
        logger.message(f"step {step}: held-out pass@1 {metrics['eval/heldout/pass_at_1']:.3f}, "
                       f"{cfg.env.eval_set} pass@1 {metrics[f'eval/{cfg.env.eval_set}/pass_at_1']:.3f} "
                       f"({metrics['timing/elapsed_min']:.1f} min)")
        return metrics

    store = CheckpointStore(str(out_dir / TRAIN_STATE))
    resumable = _Resumable(model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler)
    start, saved = _resume(cfg, store, resumable, logger)
    started = time.perf_counter() - 60 * saved.get("elapsed_min", 0.0)  # the time budget runs on across resumes
    resume_args = resume_args or f"sft.output_dir={out_dir.resolve()} sft.resume_mode=latest"
    model.train()
    metrics: dict = saved.get("metrics", {})
    step = start
    logger.progress(start)
    t_log, n_states = time.perf_counter(), 0
    try:
        for step in range(start + 1, s.steps + 1):
            raise_if_signalled()  # a Ctrl-C or SIGTERM whose exception something swallowed (see rlfw.signals)
            segments = [to_segment(processor, *state) for state in sampler.sample(s.batch_size)]
            loss, logp, mask = sft_loss(model, processor, segments, autocast)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
            optimizer.step()
            scheduler.step()
            n_states += len(segments)
            if step % 10 == 0 or step == s.steps:
                first_answer = mask.argmax(dim=1)  # the action token is the first supervised one
                p_action = logp.detach().gather(1, first_answer[:, None]).exp()
                now = time.perf_counter()
                logger.log(step, {"sft/loss": loss.item(), "sft/action_prob": p_action.mean().item(),
                                  "sft/action_acc": (p_action > 0.5).float().mean().item(),
                                  "sft/grad_norm": float(grad_norm), "sft/lr": scheduler.get_last_lr()[0],
                                  "sft/states_per_s": n_states / (now - t_log)})
                t_log, n_states = now, 0
            out_of_time = s.max_minutes is not None and time.perf_counter() - started >= 60 * s.max_minutes
            if s.eval_interval and (out_of_time or step % s.eval_interval == 0 or step == s.steps):
                metrics = run_eval(step)
                if s.stop_at_pass_at_1 is not None and metrics["eval/heldout/pass_at_1"] >= s.stop_at_pass_at_1:
                    break
            if out_of_time:
                break
            if s.ckpt_interval and step % s.ckpt_interval == 0 and step < s.steps:  # the final checkpoint follows
                t0 = time.perf_counter()
                store.save(step, resumable, cfg, 1, (time.perf_counter() - started) / 60, {"metrics": metrics})
                logger.log(step, {"timing/checkpoint": time.perf_counter() - t0})
            logger.progress(step)
    except BaseException as exc:  # Ctrl-C, SIGTERM (see rlfw.signals) or a crash
        cause = stop_cause(exc)  # a Ctrl-C or SIGTERM that a library swallowed, then failed on (rlfw.signals)
        hint = (f"rerun with {resume_args} to continue from its last saved state (every {s.ckpt_interval} steps)"
                if s.ckpt_interval else "no state is saved (sft.ckpt_interval=0), so the same command starts it again")
        logger.message(f"rlfw.sft: stopped in step {step} ({describe_stop(cause, exc)}); {hint}")
        logger.close()
        raise cause  # exc itself, or the signal's exception with exc as its __cause__
    save_checkpoint(model, processor, final, {"step": step, "seed": cfg.seed, "command": command, **metrics})
    shutil.rmtree(out_dir / TRAIN_STATE, ignore_errors=True)  # the finished run's checkpoint replaces it
    logger.close()
    print(f"rlfw.sft: checkpoint in {final.resolve()} (use model.path={final.resolve()})", flush=True)
    return metrics


def run_sft_stage(cfg: Config) -> str:
    """Run `cfg.sft_stage` (see Config.sft_stage) and return its checkpoint folder, the model.path RL
    starts from. A finished stage (its checkpoint folder, written whole or not at all) is reused, so
    a resubmitted job goes straight back to RL; an interrupted one continues from its last saved state
    when the run resumes (trainer.resume_mode), else starts the stage again."""
    stage = sft_stage_config(cfg)
    final = Path(rl_start_model(cfg))
    if final.exists():
        print(f"rlfw: SFT stage already done, RL starts from {final}", flush=True)
    else:
        size = f"{stage.sft.max_minutes} min" if stage.sft.schedule == "minutes" else f"{stage.sft.steps} steps"
        print(f"rlfw: SFT stage ({size}) in {stage.sft.output_dir}, then RL", flush=True)
        run_sft(stage, command="python -m rlfw.run " + " ".join(_overrides()) + "  # its SFT stage",
                resume_args=f"trainer.output_dir={cfg.trainer.output_dir} trainer.resume_mode=latest")
    return str(final.resolve())


def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


@hydra.main(version_base="1.3", config_path="../conf", config_name="sft")
def main(cfg: DictConfig) -> None:
    with sigterm_raises():
        run_sft(OmegaConf.to_object(cfg))


if __name__ == "__main__":
    main()
