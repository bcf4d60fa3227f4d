"""The resolved config of a run, kept in its folder: `<run>/config.yaml`.

Every entry point writes the config it actually ran with (interpolations resolved, so it holds no
`${hydra:...}`) into the run folder, whatever `trainer.output_dir` or `sft.output_dir` says. Tools
that read a run afterwards (`scripts/failure_analysis.py`, reports) load it back as the typed
dataclasses with `load_run_config`, never by recomposing today's `conf/`, which may have changed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import OmegaConf

from rlfw.config import Config, EnvConfig, EvalRunConfig, MazeEnvConfig, SFTRunConfig

RUN_CONFIG_FILE = "config.yaml"
# Schemas a saved `env` node may have been written from (a node's keys are exactly its schema's fields).
ENV_SCHEMAS = (EnvConfig, MazeEnvConfig)


def save_run_config(cfg: Config | SFTRunConfig | EvalRunConfig, run_dir: str | Path) -> Path:
    """Write `cfg` to `<run_dir>/config.yaml`, in one step (`rlfw.storage.atomic_write`)."""
    from rlfw.storage import LOCAL, atomic_write

    path = Path(run_dir) / RUN_CONFIG_FILE
    atomic_write(LOCAL, str(path), OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True).encode())
    return path


def _env_schema(keys: set[str]) -> type[EnvConfig]:
    for schema in ENV_SCHEMAS:
        if {f.name for f in dataclasses.fields(schema)} == keys:
            return schema
    raise ValueError(f"the saved env config has keys {sorted(keys)}, which match no env schema of "
                     f"{[s.__name__ for s in ENV_SCHEMAS]}")


def load_run_config(run_dir: str | Path) -> Config | SFTRunConfig | EvalRunConfig:
    """The typed config a run was started with, from `<run_dir>/config.yaml`."""
    path = Path(run_dir) / RUN_CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {run_dir} is not an rlfw run folder (or predates it)")
    saved = OmegaConf.load(path)
    root = SFTRunConfig if "sft" in saved else EvalRunConfig if "eval" in saved else Config
    schema = OmegaConf.structured(root)
    schema.env = OmegaConf.structured(_env_schema(set(saved.env.keys())))
    return OmegaConf.to_object(OmegaConf.merge(schema, saved))
