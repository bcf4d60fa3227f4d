"""Entry point: `python -m rlfw.run algo=grpo env=maze` (Hydra; `-m` sweeps).

Composes the typed config, validates it before anything starts, builds the starting model, places
the trainer and rollout engines with Ray, trains, and prints where the outputs went.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rlfw.config import Config, register_configs
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
    seed_everything(cfg.seed)
    model_path = prepare_base_model(cfg.model, make_env_fn(cfg.env), out_dir, cfg.seed)
    logger = build_logger(cfg, out_dir)
    logger.message(describe_start(cfg.model, model_path))
    try:
        final = train_with_restarts(cfg, out_dir, model_path, logger)
    except BaseException as exc:
        hint = (f"rerun with trainer.output_dir={out_dir} trainer.resume_mode=latest" if cfg.trainer.ckpt_interval
                else "no checkpoints were written (trainer.ckpt_interval=0)")
        logger.message(f"rlfw: training stopped after step {logger.last_step} ({type(exc).__name__}: {exc}); {hint}")
        raise
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


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    final = main_from_config(to_config(cfg))
    return final.get("eval/all/pass_at_1")  # the sweep objective: one meaning at every evaluation


if __name__ == "__main__":
    main()
