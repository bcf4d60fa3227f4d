"""Entry point: `python -m rlfw.run algo=grpo env=maze` (Hydra; `-m` sweeps).

Composes the typed config, validates it before anything starts, builds the starting model, places
the trainer and rollout engines with Ray, trains, and prints where the outputs went. It returns the
last value of `sweep.objective` (default eval/all/pass_at_1), which an optimizing sweeper maximizes:
`python -m rlfw.run -m experiment=sweep_optuna` is a seeded Optuna study, and
`hydra/launcher=joblib hydra.launcher.n_jobs=N` runs a sweep's jobs N at a time (README, "Sweeps").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rlfw.config import Config, register_configs
from rlfw.signals import describe_stop, rearm_sigterm, sigterm_raises, stop_cause
from rlfw.validation import validate

register_configs()
log = logging.getLogger("rlfw")


def to_config(cfg: DictConfig) -> Config:
    return OmegaConf.to_object(cfg)


def main_from_config(cfg: Config) -> dict:
    from rlfw.build import build_logger, describe_start, make_env_fn, prepare_base_model, seed_everything
    from rlfw.checkpoint import preflight
    from rlfw.config_io import save_run_config

    validate(cfg)
    out_dir = Path(cfg.trainer.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_run_config(cfg, out_dir)
    t = cfg.trainer
    if t.ckpt_interval:
        preflight(t.ckpt_path, t.ckpt_storage_options, "trainer.ckpt_path")
    if t.hf_save_interval:
        preflight(t.export_path, t.ckpt_storage_options, "trainer.export_path")
    if cfg.sft_stage is not None:  # SFT first, then RL from its checkpoint (Config.sft_stage)
        from dataclasses import replace

        from rlfw.sft import run_sft_stage

        cfg = replace(cfg, model=replace(cfg.model, path=run_sft_stage(cfg)))
    seed_everything(cfg.seed)
    model_path = prepare_base_model(cfg.model, make_env_fn(cfg.env), out_dir, cfg.seed)
    logger = build_logger(cfg, out_dir)
    logger.message(describe_start(cfg.model, model_path))
    if (note := oversubscription(cfg, parallel_jobs())) is not None:
        logger.message(note)
    try:
        final = train_with_restarts(cfg, out_dir, model_path, logger)
    except BaseException as exc:
        hint = (f"rerun with trainer.output_dir={out_dir} trainer.resume_mode=latest" if cfg.trainer.ckpt_interval
                else "no checkpoints were written (trainer.ckpt_interval=0)")
        cause = stop_cause(exc)  # a Ctrl-C or SIGTERM that a library swallowed, then failed on (rlfw.signals)
        logger.message(f"rlfw: training stopped after step {logger.last_step} ({describe_stop(cause, exc)}); {hint}")
        raise cause  # exc itself, or the signal's exception with exc as its __cause__
    finally:
        logger.close()
    if cfg.trainer.eval_interval:
        from rlfw.report import before_after, plot

        print(before_after(out_dir / "metrics.jsonl"))
        plot({cfg.algo.name: out_dir / "metrics.jsonl"}, out_dir / "pass_at_1.png")
    print(f"rlfw: outputs in {out_dir.resolve()} (metrics.jsonl, pass_at_1.png, eval/, tensorboard/)", flush=True)
    return final


def train_with_restarts(cfg: Config, out_dir: Path, model_path: str, logger) -> dict:
    """Place the workers and train; if the trainer worker dies, replace every worker and resume from
    the latest checkpoint, up to cluster.max_trainer_restarts times (dead engines alone are restarted
    in place by Ray, see train.py)."""
    from dataclasses import replace

    from rlfw.distributed.ray_runtime import RayRuntime, TrainerFailure
    from rlfw.train import train

    restarts = cfg.cluster.max_trainer_restarts if cfg.trainer.ckpt_interval else 0
    for attempt in range(restarts + 1):
        runtime = RayRuntime(cfg, model_path)
        rearm_sigterm()
        try:
            return train(cfg, out_dir, model_path, runtime.policy, runtime.engine, logger)
        except TrainerFailure as exc:
            if attempt == restarts:
                raise
            logger.message(f"step {logger.last_step + 1}: {exc}; replacing the workers and resuming from the "
                           f"latest checkpoint (restart {attempt + 1} of {restarts})")
            if cfg.trainer.resume_mode != "from_path" or _has_checkpoint(cfg):
                cfg = replace(cfg, trainer=replace(cfg.trainer, resume_mode="latest"))
        finally:
            runtime.shutdown()


def _has_checkpoint(cfg: Config) -> bool:
    from rlfw.checkpoint import CheckpointStore

    store = CheckpointStore(cfg.trainer.ckpt_path, cfg.trainer.ckpt_storage_options)
    return store.find_resume(lambda _: None) is not None


def parallel_jobs() -> int:
    """How many jobs of this multirun may run at once on this machine: hydra.launcher.n_jobs under
    the joblib launcher (negative counts back from the CPU count, as joblib's does), at most the
    trials an Optuna sweeper launches together (hydra.sweeper.n_jobs); else 1."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return 1
    hc = HydraConfig.get()
    if "joblib" not in str(hc.launcher.get("_target_", "")):
        return 1
    n = int(hc.launcher.n_jobs)
    n = n if n > 0 else (os.cpu_count() or 1) + 1 + n
    return max(1, min(n, int(hc.sweeper.get("n_jobs") or n)))


def oversubscription(cfg: Config, jobs: int) -> str | None:
    """A warning when parallel jobs on this machine want more torch threads than it has cores: each
    job's colocated workers alternate, so a job keeps about cluster.torch_threads cores busy.
    Oversubscribed torch threads wait on each other (measured on 2 cores, debug steps: 0.3-0.5 s with
    2 jobs x 1 thread, 1.3-3.7 s with 2 jobs x 2 threads)."""
    cores = os.cpu_count() or 1
    threads = cfg.cluster.torch_threads
    if jobs < 2 or cfg.cluster.ray_address or jobs * threads <= cores:
        return None
    return (f"warning: up to {jobs} jobs run at once here (hydra.launcher.n_jobs), each with cluster.torch_threads="
            f"{threads}, on {cores} cores: oversubscribed torch threads slow every job several-fold; "
            f"set cluster.torch_threads={max(1, cores // jobs)}")


def check_objective(cfg: Config) -> None:
    """Fail before training when the sweep objective can never be logged."""
    from rlfw.validation import ConfigError

    name = cfg.sweep.objective
    if name and name.startswith("eval/") and not cfg.trainer.eval_interval:
        raise ConfigError(f"sweep.objective={name} is an evaluation metric, but trainer.eval_interval=0 never "
                          "evaluates: set trainer.eval_interval > 0, choose another metric, or sweep.objective=null")


def objective(final: dict, name: str | None, required: bool) -> float | None:
    """The last logged value of metric `name`; a missing one raises when `required` (in a multirun)."""
    if name is None:
        return None
    if name not in final:
        if not required:
            return None
        logged = ", ".join(sorted(final)) or "none"
        raise LookupError(f"sweep.objective={name} was never logged by this run, so there is nothing to return to "
                          f"the sweeper; logged metrics: {logged}")
    return float(final[name])


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train; return sweep.objective's last value (the sweeper's objective). In a multirun a job
    whose objective cannot or did not get logged fails, so an optimizing sweeper never sees None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    config = to_config(cfg)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun:
        check_objective(config)
    with sigterm_raises():
        final = main_from_config(config)
    return objective(final, config.sweep.objective, required=multirun)


if __name__ == "__main__":
    main()
