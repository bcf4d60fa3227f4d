"""The CUDA path of the trainer and the transformers engine (cluster.gpus_per_worker > 0).

Marked `gpu`: excluded from the default run, `pytest -m gpu` on a machine with a CUDA device.
The CPU-only test at the end runs everywhere."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfw.config import AlgoConfig
from rlfw.distributed.workers import worker_device
from rlfw.rollout.types import Prompt, SamplingParams, TrainBatch
from tests.rlfw.test_policy_sync import _setup

ROOT = Path(__file__).resolve().parents[2]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture
def no_tf32():
    """cuDNN runs convolutions (the vision patch embedding) in TF32 by default, which moves a 2-step
    AdamW update by ~1e-4 against the CPU's; in full fp32 the two agree to ~1e-6 of the update."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_update_on_cuda_matches_cpu(tmp_path, no_tf32, optimizer):
    algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=8)
    deltas = {}
    for device in ("cpu", "cuda"):
        policy, _, segments, groups = _setup(tmp_path / device, 4, algo)
        policy.trainer.model.to(device)
        policy.trainer.device = torch.device(device)
        if optimizer == "sgd":  # the update is the gradient itself: nothing normalises a scaled one away
            policy.trainer.optimizer = torch.optim.SGD(policy.trainer.params, lr=1.0)
        before = {k: v.cpu().clone() for k, v in policy.trainable_state().items()}
        advantages = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
        policy.update(TrainBatch(segments, advantages, groups), step=1)
        policy.update(TrainBatch(segments, advantages, groups), step=2)
        deltas[device] = {k: v.cpu() - before[k] for k, v in policy.trainable_state().items()}
    for name, want in deltas["cpu"].items():
        assert want.abs().max() > 0, name
        torch.testing.assert_close(deltas["cuda"][name], want, atol=1e-4 * want.abs().max().item(), rtol=1e-3)


@pytest.mark.gpu
@needs_cuda
def test_engine_on_cuda_generates_what_cpu_generates(tmp_path):
    from rlfw.rollout.engine import TransformersEngine

    _, engine, segments, _ = _setup(tmp_path, 4, AlgoConfig(name="grpo"))
    requests = [Prompt(s.token_ids[: s.loss_mask.index(1)], s.images) for s in segments[:4]]
    params = SamplingParams(max_new_tokens=3, greedy=True)
    cpu = engine.engine.generate(requests, params)
    gpu_engine = TransformersEngine(engine.engine.model, engine.engine.processor, device="cuda")
    gpu = gpu_engine.generate(requests, params)
    assert [c.token_ids for c in gpu] == [c.token_ids for c in cpu]
    np.testing.assert_allclose([c.logprobs for c in gpu], [c.logprobs for c in cpu], atol=1e-3)


@pytest.mark.gpu
@needs_cuda
def test_debug_run_on_one_gpu(tmp_path):
    pytest.importorskip("ray", reason="the run starts Ray workers")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlfw.run", "experiment=debug", "cluster.gpus_per_worker=1",
                           f"trainer.output_dir={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "lora_sync" / "v2" / "adapter_model.safetensors").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_asking_for_a_gpu_without_cuda_says_how_to_fix():
    assert worker_device(0.0) == "cpu"
    with pytest.raises(RuntimeError, match="cluster.gpus_per_worker=0"):
        worker_device(1.0)
