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
def test_bf16_autocast_on_cuda_follows_float32(tmp_path, no_tf32):
    """model.train_autocast=bfloat16 on CUDA: teacher-forced log-probs within bf16's precision of
    float32's, and an SGD update (the gradient itself) pointing where float32's points."""
    from rlfw.policy import sequence_logprobs

    algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=8)
    logps, deltas = {}, {}
    for autocast in (None, "bfloat16"):
        policy, _, segments, groups = _setup(tmp_path / str(autocast), 4, algo)
        trainer = policy.trainer
        trainer.model.to("cuda")
        trainer.device, trainer.autocast = torch.device("cuda"), autocast
        trainer.optimizer = torch.optim.SGD(trainer.params, lr=1.0)
        with torch.no_grad():
            logp, mask, _ = sequence_logprobs(trainer.model, trainer.processor, segments, autocast=autocast)
        logps[autocast] = logp[mask.bool()].cpu()
        before = {k: v.cpu().clone() for k, v in policy.trainable_state().items()}
        advantages = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
        policy.update(TrainBatch(segments, advantages, groups), step=1)
        deltas[autocast] = torch.cat([(v.cpu() - before[k]).flatten() for k, v in policy.trainable_state().items()])
    assert logps[None].numel() > 0
    torch.testing.assert_close(logps["bfloat16"], logps[None], atol=0.05, rtol=0)
    full, half = deltas[None], deltas["bfloat16"]
    assert full.norm() > 0
    assert torch.nn.functional.cosine_similarity(full, half, dim=0) > 0.99
    assert (half - full).norm() < 0.1 * full.norm()


@pytest.mark.gpu
@needs_cuda
def test_bf16_engine_on_cuda_reports_float32s_logprobs(tmp_path):
    """model.engine_autocast=bfloat16 on CUDA: where its greedy tokens agree with float32's, the
    log-probs it reports agree with float32's within bf16's precision."""
    from rlfw.rollout.engine import TransformersEngine

    _, engine, segments, _ = _setup(tmp_path, 4, AlgoConfig(name="grpo"))
    requests = [Prompt(s.token_ids[: s.loss_mask.index(1)], s.images) for s in segments[:4]]
    params = SamplingParams(max_new_tokens=3, greedy=True)
    model, processor = engine.engine.model, engine.engine.processor
    full = TransformersEngine(model, processor, device="cuda").generate(requests, params)
    half_engine = TransformersEngine(model, processor, device="cuda", autocast="bfloat16")
    assert half_engine.autocast == "bfloat16"
    half = half_engine.generate(requests, params)
    compared = 0
    for a, b in zip(full, half):
        for ta, tb, la, lb in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs):
            if ta != tb:
                break
            assert abs(la - lb) < 0.05, (la, lb)
            compared += 1
    assert compared > 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_debug_run_on_one_gpu(tmp_path, precision):
    """Two RL steps with the trainer and the engine as Ray workers on one GPU; `bf16` turns on
    model.train_autocast and model.engine_autocast (auto: bf16 where the GPU has it)."""
    pytest.importorskip("ray", reason="the run starts Ray workers")
    import json

    out = tmp_path / "run"
    extra = ["model.train_autocast=auto", "model.engine_autocast=auto"] if precision == "bf16" else []
    proc = subprocess.run([sys.executable, "-m", "rlfw.run", "experiment=debug", "cluster.gpus_per_worker=1",
                           f"trainer.output_dir={out}", *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "lora_sync" / "v2" / "adapter_model.safetensors").exists()
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    steps = [r for r in rows if "policy/loss" in r]
    assert len(steps) == 2 and all(np.isfinite(r["policy/loss"]) for r in steps)
    # the engine's sampled log-probs against the trainer's teacher-forced ones (bf16 on either side widens it)
    diffs = [r["policy/rollout_logp_abs_diff"] for r in steps]
    print(f"{precision}: rollout_logp_abs_diff per step {diffs}, timing/step {[r.get('timing/step') for r in steps]}")
    assert all(d < (0.1 if precision == "bf16" else 0.01) for d in diffs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_asking_for_a_gpu_without_cuda_says_how_to_fix():
    assert worker_device(0.0) == "cpu"
    with pytest.raises(RuntimeError, match="cluster.gpus_per_worker=0"):
        worker_device(1.0)
