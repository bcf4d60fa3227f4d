"""Run `rlfw.train.train` in this process: the same trainer and engine classes Ray would place,
called directly, with the config composed from conf/ exactly as `python -m rlfw.run` composes it."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlfw.config import Config, register_configs, repo_root
from rlfw.validation import validate

register_configs()


def compose_config(out_dir: Path, *overrides: str) -> Config:
    with initialize_config_dir(config_dir=repo_root() + "/conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"trainer.output_dir={out_dir}", *overrides])
    cfg = OmegaConf.to_object(cfg)
    validate(cfg)
    return cfg


def _call(calls):
    return [getattr(worker, method)(*args) for worker, method, args in calls]


def train_in_process(cfg: Config) -> dict:
    """`rlfw.run`'s main path without Ray: build the base model, the workers and the logger, train."""
    from rlfw.build import build_logger, make_env_fn, prepare_base_model, seed_everything
    from rlfw.distributed.workers import EnginePool, EngineWorker, PolicyWorker
    from rlfw.train import train

    out = Path(cfg.trainer.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    path = prepare_base_model(cfg.model, make_env_fn(cfg.env), out, cfg.seed)
    policy = PolicyWorker(cfg.model, cfg.algo, path, cfg.trainer.total_steps, cfg.seed, torch_threads=1)
    engine = EnginePool([EngineWorker(cfg.model, path, torch_threads=1)], _call)
    logger = build_logger(cfg, out)
    try:
        return train(cfg, out, path, policy, engine, logger)
    finally:
        logger.close()


def train_rows(out_dir: Path, *overrides: str) -> list[dict]:
    """Compose `overrides` (after experiment=debug without evaluation), train in process, and return
    the metrics.jsonl rows of the training steps."""
    cfg = compose_config(out_dir, "experiment=debug", "trainer.eval_interval=0", *overrides)
    train_in_process(cfg)
    rows = map(json.loads, (Path(out_dir) / "metrics.jsonl").read_text().splitlines())
    return [r for r in rows if "policy/loss" in r]
