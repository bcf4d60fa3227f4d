"""The multi-turn loop keeps sampled tokens verbatim and masks everything the model did not write."""

import numpy as np
import pytest

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import EnvConfig, ModelConfig
from rlfw.distributed.workers import EngineWorker
from rlfw.models.processing import PolicyProcessor
from rlfw.config import TinyVLSpec
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.types import SamplingParams, Task


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    env_cfg = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=3, kwargs={"cell_px": 8})
    make_env = make_env_fn(env_cfg)
    model = ModelConfig(name="tiny_vl", tiny=TinyVLSpec(hidden_size=64, num_layers=1, intermediate_size=128,
                                                         vision_depth=1))
    path = prepare_base_model(model, make_env, tmp_path_factory.mktemp("m"), seed=0)
    return EngineWorker(model, path, torch_threads=1), PolicyProcessor.from_pretrained(path), make_env


@pytest.mark.parametrize("history", ["none", "full"])
def test_segments_mask_only_generated_tokens(setup, history):
    engine, processor, make_env = setup
    envs = [make_env() for _ in range(4)]
    limits = LoopLimits(max_turns=3, max_new_tokens=4, max_episode_tokens=4096, history=history)
    episodes = collect(engine, processor, envs, [Task(seed=10**6), Task(seed=10**6 + 7)], 2,
                       SamplingParams(max_new_tokens=4), limits)
    assert [e.group_id for e in episodes] == [0, 0, 1, 1]
    for e in episodes:
        assert 1 <= e.turns <= 3 and len(e.actions) == e.turns
        expected_segments = e.turns if history == "none" else 1
        assert len(e.segments) == expected_segments
        generated = 0
        for s in e.segments:
            assert len(s.token_ids) == len(s.loss_mask) == len(s.logprobs)
            n_image_tokens = sum(t == processor.image_token_id for t in s.token_ids)
            assert n_image_tokens == 81 * len(s.images)  # 9x9 grid squares, one token each
            gen = [t for t, m in zip(s.token_ids, s.loss_mask) if m]
            assert processor.image_token_id not in gen
            assert all(lp <= 0 for lp, m in zip(s.logprobs, s.loss_mask) if m)
            assert all(lp == 0 for lp, m in zip(s.logprobs, s.loss_mask) if not m)
            generated += len(gen)
        assert generated == e.generated_tokens
        if history == "full":
            assert len(e.segments[0].images) == e.turns


def test_episode_token_limit_truncates(setup):
    engine, processor, make_env = setup
    envs = [make_env() for _ in range(2)]
    obs, _ = envs[0].reset(seed=10**6)
    first = processor.encode_message({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": obs["text"]}]},
                                     [obs["image"]]) + processor.generation_prompt_ids
    limit = len(first) + 4 + 10  # room for turn 1 only: turn 2 alone adds 81 image tokens
    limits = LoopLimits(max_turns=3, max_new_tokens=4, max_episode_tokens=limit, history="full")
    episodes = collect(engine, processor, envs, [Task(seed=10**6)], 2, SamplingParams(max_new_tokens=4), limits)
    for e in episodes:
        assert e.turns == 1
        assert len(e.segments[0].token_ids) <= limit
        assert len(e.segments[0].images) == 1
