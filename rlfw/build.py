"""The one place that turns config into objects: envs, the starting model, the logger.

Below this module code receives objects and dataclasses, never a DictConfig.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Callable

import gymnasium as gym

from rlfw.config import Config, EnvConfig, EvalConfig, ModelConfig

# Fields of the base EnvConfig are the framework's own, except max_turns, which the env also takes;
# every field a subclass schema adds (difficulty, cell_px, ...) is an env kwarg.
_FRAMEWORK_ENV_FIELDS = {f.name for f in dataclasses.fields(EnvConfig)} - {"max_turns"}


def env_kwargs(env: EnvConfig) -> dict:
    """Keyword arguments for gymnasium.make: the schema's env-specific fields, max_turns, kwargs."""
    out = {f.name: getattr(env, f.name) for f in dataclasses.fields(env) if f.name not in _FRAMEWORK_ENV_FIELDS}
    out.update(env.kwargs)
    return out


def make_env_fn(env: EnvConfig, crop_px: int = 0) -> Callable[[], gym.Env]:
    """A factory for the configured env; imports `envs` and the user's `env.module` first.

    `crop_px` cuts that many pixels from each side of every observation image
    (`envs.wrappers.CropImage`): pass the policy's own, `PolicyProcessor.crop_px` (recorded in its
    model folder), so that the env shows every consumer of the policy the pixels it was trained on.
    0 gives the env's full renders (what a new tiny_vl is sized from)."""
    import envs
    from envs.wrappers import CropImage

    if env.module:
        envs.import_env_module(env.module)
    if env.id not in gym.registry:
        raise ValueError(f"env.id={env.id!r} is not registered; registered rlfw envs: {envs.list_envs()}"
                         + ("" if env.module else " (set env.module=<your.module> to import your own)"))
    kwargs = env_kwargs(env)
    if crop_px:
        return lambda: CropImage(gym.make(env.id, **kwargs), crop_px)
    return lambda: gym.make(env.id, **kwargs)


def env_corpus(make_env: Callable[[], gym.Env], n_resets: int = 8) -> tuple[list[str], list[str], int]:
    """Text the env produces (prompts and feedback), its action strings, and its image side in px."""
    env = make_env()
    corpus = ["system", "user", "assistant"]
    actions = list(getattr(env.unwrapped, "action_strings", []))
    image_px = 0
    for seed in range(n_resets):
        obs, _ = env.reset(seed=seed)
        corpus.append(obs["text"])
        image_px = obs["image"].shape[0]
        for action in actions + ["", "?"]:
            corpus.append(env.step(action)[0]["text"])
    env.close()
    return corpus, actions, image_px


def prepare_base_model(model: ModelConfig, make_env: Callable[[], gym.Env], out_dir: Path, seed: int) -> str:
    """Return a checkpoint path: `model.path`, or a freshly built tiny_vl saved under out_dir."""
    if model.path:
        return model.path
    from rlfw.models.tiny_vl import build_tiny_vl

    path = out_dir / "base_model"
    if not (path / "config.json").exists():
        corpus, actions, image_px = env_corpus(make_env)
        net, processor = build_tiny_vl(model.tiny, corpus, actions, image_px, seed=seed)
        net.save_pretrained(str(path))
        processor.save_pretrained(path)
    return str(path)


def describe_start(model: ModelConfig, path: str) -> str:
    """One line for the start of a run: which weights it starts from, and how to choose others."""
    import json

    tune = f"LoRA rank {model.lora.rank}" if model.lora.rank else "full fine-tuning"
    if not model.path:
        return (f"model: a random-init tiny_vl ({path}), {tune}; the outcome reward alone will not teach it "
                "mazes: the default model=tiny_vl_sft starts from the shipped SFT checkpoint")
    record = Path(path) / "rlfw_sft.json"
    scores = ""
    if record.exists():
        info = json.loads(record.read_text())
        scores = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in info.items()
                           if k.startswith("eval/") and k.endswith("/pass_at_1"))
        scores = f" (SFT; greedy pass@1 {scores})" if scores else " (SFT)"
    return f"model: starting from {path}{scores}, {tune}; model=tiny_vl builds a random-init policy instead"


def build_policy_model(model: ModelConfig, path: str):
    """Load the checkpoint at `path` and wrap it with the configured LoRA (rank 0: full fine-tuning)."""
    from rlfw.models import apply_lora, load_policy

    net, processor = load_policy(path, model.dtype, model.attn_implementation)
    lora = model.lora
    return apply_lora(net, lora.rank, lora.alpha, lora.dropout, lora.target_modules), processor


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_logger(cfg: Config, out_dir: Path):
    from rlfw.logging import MetricLogger

    # a run sized by wall time (trainer.schedule=minutes) ends long before its total_steps cap: its
    # bar is a count and a rate, as SFT's is, not a length with a days-long ETA
    t = cfg.trainer
    return MetricLogger(cfg.logger, out_dir, total_steps=t.total_steps if t.schedule == "steps" else None,
                        run_config=cfg)


class TrainingFilter:
    """Whether a training maze stays clear of every evaluation maze (`envs.eval_sets.reserved_keys`).

    `allowed(seed)` resets a probe env of its own to the seed and looks at its layout;
    `allowed.admits(layout)` judges a layout already in hand, so a caller that resets its own env to
    the seed anyway (`rlfw.rollout.demos.DemoSampler`) does not generate each maze twice.
    """

    def __init__(self, probe: gym.Env, reserved: frozenset):
        from envs.eval_sets import layout_key

        self._probe, self._reserved, self._key = probe, reserved, layout_key

    def __call__(self, seed: int) -> bool:
        self._probe.reset(seed=seed)
        return self.admits(self._probe.layout())

    def admits(self, layout: dict) -> bool:
        return self._key(layout) not in self._reserved


def training_filter(env: EnvConfig, heldout_size: int = 0) -> TrainingFilter | None:
    """`allowed(seed)`: whether a training seed's layout stays clear of every evaluation maze
    (`envs.eval_sets.reserved_keys`, with at least `heldout_size` held-out layouts); see
    `TrainingFilter`. None when the env cannot export layouts, so there is nothing to compare."""
    from envs.eval_sets import RESERVED_HELDOUT, reserved_keys

    probe = make_env_fn(env)().unwrapped
    if not hasattr(probe, "layout"):
        return None
    return TrainingFilter(probe, reserved_keys(env.id, max(RESERVED_HELDOUT, heldout_size), **env_kwargs(env)))


def eval_tasks(env: EnvConfig, eval_set: str | None = None, size: int | None = None):
    """Evaluation tasks and their layouts (None when the env cannot export layouts).

    `heldout` is one episode per seed from envs.eval_sets.HELD_OUT_SEED_START on, as layouts when
    the env has `layout()` (so the solvable ceiling can be reported), else as bare seeds.
    """
    from envs.eval_sets import FIXED_SETS, HELD_OUT_SEED_START, load_eval_set

    from rlfw.rollout.types import Task

    name, size = eval_set or env.eval_set, size or env.eval_size
    if name == "heldout":
        probe = make_env_fn(env)()
        if not hasattr(probe.unwrapped, "layout"):
            return [Task(seed=HELD_OUT_SEED_START + i) for i in range(size)], None
        layouts = load_eval_set("generated", n=size, env_id=env.id, **env_kwargs(env))
    elif name in FIXED_SETS:
        layouts = load_eval_set(name)
    else:
        raise ValueError(f"eval set {name!r}: use heldout or one of {sorted(FIXED_SETS)}")
    return [Task(seed=int(layout.get("seed", i)), layout=layout) for i, layout in enumerate(layouts)], layouts


def eval_set_names(cfg: EvalConfig) -> list[str]:
    """The named sets `python -m rlfw.eval` plays: eval.sets, or by default [eval64] (none when
    eval.layouts is given)."""
    if cfg.sets is not None:
        return list(cfg.sets)
    return [] if cfg.layouts else ["eval64"]
