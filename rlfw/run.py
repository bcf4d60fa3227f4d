"""Entry point: `python -m rlfw.run algo=grpo env=maze` (Hydra; `-m` sweeps).

Composes the typed config, validates it before anything starts, builds the starting model, places
the trainer and rollout engines with Ray, trains, and prints where the outputs went.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rlfw.config import Config, register_configs, validate

register_configs()
log = logging.getLogger("rlfw")


def to_config(cfg: DictConfig) -> Config:
    return OmegaConf.to_object(cfg)


def main_from_config(cfg: Config) -> dict:
    from rlfw.build import build_logger, make_env_fn, prepare_base_model, seed_everything
    from rlfw.checkpoint import CheckpointStore
    from rlfw.distributed.ray_runtime import RayRuntime
    from rlfw.train import train

    validate(cfg)
    out_dir = Path(cfg.trainer.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.trainer.ckpt_interval or cfg.trainer.hf_save_interval:
        CheckpointStore(cfg.trainer.ckpt_path, cfg.trainer.ckpt_storage_options).preflight()
    seed_everything(cfg.seed)
    model_path = prepare_base_model(cfg.model, make_env_fn(cfg.env), out_dir, cfg.seed)
    logger = build_logger(cfg, out_dir)
    runtime = None
    try:
        runtime = RayRuntime(cfg, model_path)
        final = train(cfg, out_dir, model_path, runtime.policy, runtime.engine, logger)
    except BaseException:
        hint = (f"rerun with trainer.output_dir={out_dir} trainer.resume_mode=latest" if cfg.trainer.ckpt_interval
                else "no checkpoints were written (trainer.ckpt_interval=0)")
        print(f"rlfw: training stopped after step {logger.last_step}; {hint}", flush=True)
        raise
    finally:
        logger.close()
        if runtime is not None:
            runtime.shutdown()
    if cfg.trainer.eval_interval:
        from rlfw.report import before_after, plot

        print(before_after(out_dir / "metrics.jsonl"))
        plot({cfg.algo.name: out_dir / "metrics.jsonl"}, out_dir / "pass_at_1.png")
    print(f"rlfw: outputs in {out_dir.resolve()} (metrics.jsonl, pass_at_1.png, eval/, tensorboard/)", flush=True)
    return final


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    final = main_from_config(to_config(cfg))
    key = next((k for k in final if k.startswith("eval/all/pass_at_1")), None)
    return final.get(key) if key else None


if __name__ == "__main__":
    main()
