"""The trainer's update reaches the engine: after a sync the engine samples from the new policy.

The classic silent failure of RL frameworks is an engine that keeps sampling from the initial
policy. Here: one update with a nonzero advantage, publish through the sync folder, and check
that the engine's log-probs of the same tokens changed and now equal the trainer's.
"""

import numpy as np
import pytest
import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import AlgoConfig, EnvConfig, LoraConfig, ModelConfig
from rlfw.distributed.workers import EngineWorker, PolicyWorker
from rlfw.models.processing import PolicyProcessor
from rlfw.config import TinyVLSpec
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.types import SamplingParams, Task, TrainBatch

SPEC = TinyVLSpec(hidden_size=64, num_layers=1, intermediate_size=128, vision_depth=1)


def _setup(tmp_path, rank: int, algo: AlgoConfig):
    env_cfg = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=2, kwargs={"cell_px": 8})
    make_env = make_env_fn(env_cfg)
    model = ModelConfig(name="tiny_vl", tiny=SPEC, lora=LoraConfig(rank=rank, alpha=2 * max(rank, 1)))
    path = prepare_base_model(model, make_env, tmp_path, seed=0)
    policy = PolicyWorker(model, algo, path, total_steps=4, seed=0, torch_threads=1)
    engine = EngineWorker(model, path, torch_threads=1)
    processor = PolicyProcessor.from_pretrained(path)
    envs = [make_env() for _ in range(4)]
    limits = LoopLimits(max_turns=2, max_new_tokens=3, max_episode_tokens=2048)
    episodes = collect(engine, processor, envs, [Task(seed=10**6), Task(seed=10**6 + 1)], 2,
                       SamplingParams(max_new_tokens=3), limits)
    segments = [s for e in episodes for s in e.segments]
    groups = [e.group_id for e in episodes for _ in e.segments]
    return policy, engine, segments, groups


def _engine_logprobs(engine, segments):
    """Teacher-forced log-probs of the segments' tokens under the engine's model."""
    from rlfw.policy import sequence_logprobs

    with torch.no_grad():
        logp, _, _ = sequence_logprobs(engine.engine.model, engine.engine.processor, segments)
    return [logp[i, : len(s.token_ids) - 1].tolist() for i, s in enumerate(segments)]


@pytest.mark.parametrize("rank", [4, 0])
def test_sync_reaches_engine_and_matches_trainer(tmp_path, rank):
    algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=8)
    policy, engine, segments, groups = _setup(tmp_path, rank, algo)

    # sampled log-probs reported by the engine equal the trainer's teacher-forced ones (same weights)
    trainer_before = policy.logprobs(segments)
    for seg, lp in zip(segments, trainer_before):
        gen = [i for i, m in enumerate(seg.loss_mask) if m]
        np.testing.assert_allclose([lp[i - 1] for i in gen], [seg.logprobs[i] for i in gen], atol=1e-4)

    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(segments))]
    before = policy.trainable_state()
    stats = policy.update(TrainBatch(segments, advantages, groups), step=1)
    after = policy.trainable_state()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert np.isfinite(stats["loss"])

    engine_before = _engine_logprobs(engine, segments)
    policy.save_weights(str(tmp_path / "sync"), 1)
    assert engine.load_weights(str(tmp_path / "sync")) == 1
    engine_after = _engine_logprobs(engine, segments)
    trainer_after = policy.logprobs(segments)
    flat = lambda xs: np.concatenate([np.asarray(x) for x in xs])
    assert np.abs(flat(engine_after) - flat(engine_before)).max() > 1e-3, "engine still samples the old policy"
    np.testing.assert_allclose(flat(engine_after), flat(trainer_after), atol=1e-4)


def test_update_raises_logprob_of_rewarded_sample(tmp_path):
    """Sign check through the real model: the positive-advantage segment becomes more likely."""
    algo = AlgoConfig(name="grpo", lr=5e-3, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=8)
    policy, _, segments, groups = _setup(tmp_path, 4, algo)
    seg_pos, seg_neg = segments[0], segments[1]
    def gen_logp(lps, seg):
        return sum(lps[i - 1] for i, m in enumerate(seg.loss_mask) if m)
    before = policy.logprobs([seg_pos, seg_neg])
    for _ in range(3):
        policy.update(TrainBatch([seg_pos, seg_neg], [1.0, -1.0], [0, 1]), step=1)
    after = policy.logprobs([seg_pos, seg_neg])
    assert gen_logp(after[0], seg_pos) > gen_logp(before[0], seg_pos)
    assert gen_logp(after[1], seg_neg) < gen_logp(before[1], seg_neg)
