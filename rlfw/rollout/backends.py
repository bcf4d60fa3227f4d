"""Rollout engine backends by name (`cluster.engine_backend`): each builds an `InferenceEngine`.

A backend is a function `(model_cfg, path, cluster, device) -> InferenceEngine`, imported only
when chosen, so the transformers path never imports vLLM.
"""

from __future__ import annotations

from rlfw.config import ClusterConfig, ModelConfig


def _transformers(model_cfg: ModelConfig, path: str, cluster: ClusterConfig, device: str):
    from rlfw.build import build_policy_model
    from rlfw.rollout.engine import TransformersEngine

    model, processor = build_policy_model(model_cfg, path)
    return TransformersEngine(model.requires_grad_(False), processor, device=device, autocast=model_cfg.engine_autocast)


def _vllm(model_cfg: ModelConfig, path: str, cluster: ClusterConfig, device: str):
    from rlfw.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(path, model_cfg, cluster.vllm)


BACKENDS = {"transformers": _transformers, "vllm": _vllm}


def build_engine(backend: str, model_cfg: ModelConfig, path: str, cluster: ClusterConfig, device: str):
    if backend not in BACKENDS:
        raise ValueError(f"cluster.engine_backend={backend!r} is not one of {sorted(BACKENDS)}")
    return BACKENDS[backend](model_cfg, path, cluster, device)
