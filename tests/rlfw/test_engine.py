"""The transformers engine's own decode loop: identical prompts share one prefill without changing
what any of them generates, greedy decoding equals `model.generate`, and a merged LoRA adapter
gives the same outputs as the unmerged one."""

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import EnvConfig, LoraConfig, ModelConfig
from rlfw.distributed.workers import EngineWorker
from rlfw.models.processing import collate
from rlfw.rollout.agent_loop import turn_message
from rlfw.rollout.types import Prompt, SamplingParams
from tests.rlfw.test_policy_sync import SPEC


def _engine_and_prompts(tmp_path, rank=0):
    env_cfg = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=2, kwargs={"cell_px": 8})
    make_env = make_env_fn(env_cfg)
    model = ModelConfig(name="tiny_vl", tiny=SPEC, lora=LoraConfig(rank=rank, alpha=2 * max(rank, 1)))
    path = prepare_base_model(model, make_env, tmp_path, seed=0)
    worker = EngineWorker(model, path, torch_threads=1)
    engine = worker.engine
    p = engine.processor
    env, prompts = make_env(), []
    for seed in (10**6, 10**6 + 1):
        obs, _ = env.reset(seed=seed)
        ids = p.encode_message(turn_message(obs["text"], ""), [obs["image"]]) + p.generation_prompt_ids
        prompts.append(Prompt(ids, [obs["image"]]))
    return engine, prompts


def test_shared_prefill_matches_separate_generation_and_model_generate(tmp_path):
    engine, (a, b) = _engine_and_prompts(tmp_path)
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    together = engine.generate([a, a, b, a], greedy)
    assert engine.stats == {"prompts": 4, "prefilled": 2}
    alone = engine.generate([a], greedy) + engine.generate([b], greedy)
    for got, want in zip(together, [alone[0], alone[0], alone[1], alone[0]]):
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5, rtol=0)

    # the same greedy tokens as transformers' own generate over the same left-padded batch
    p = engine.processor
    feats = [[p.image_features(im) for im in pr.images] for pr in (a, b)]
    batch = collate([a.token_ids, b.token_ids], feats, p.image_token_id, p.pad_token_id, left_pad=True)
    with torch.no_grad():
        ref = engine.model.generate(**batch, max_new_tokens=4, do_sample=False, eos_token_id=p.eos_token_id,
                                    pad_token_id=p.pad_token_id, suppress_tokens=p.banned_token_ids)
    for row, got in zip(ref[:, batch["input_ids"].shape[1]:].tolist(), [alone[0], alone[1]]):
        assert row[: len(got.token_ids)] == got.token_ids


def test_copies_of_a_prompt_sample_independently(tmp_path):
    engine, (a, _) = _engine_and_prompts(tmp_path)
    torch.manual_seed(0)
    out = engine.generate([a] * 16, SamplingParams(max_new_tokens=3))
    assert engine.stats["prefilled"] == 1
    assert len({tuple(c.token_ids) for c in out}) > 1  # an untrained model's replies vary
    assert all(c.token_ids and len(c.token_ids) == len(c.logprobs) for c in out)


def test_merged_lora_adapter_generates_like_the_unmerged_one(tmp_path):
    engine, prompts = _engine_and_prompts(tmp_path, rank=4)
    assert engine.lora
    engine.model.unmerge_adapter()  # the engine merged its adapter at start
    with torch.no_grad():  # a nonzero adapter, as after training
        for name, param in engine.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    engine.model.merge_adapter()
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    merged = engine.generate(prompts, greedy)
    engine.model.unmerge_adapter()
    unmerged = engine.generate(prompts, greedy)
    for m, u in zip(merged, unmerged):
        assert m.token_ids == u.token_ids
        torch.testing.assert_close(torch.tensor(m.logprobs), torch.tensor(u.logprobs), atol=1e-4, rtol=0)


def test_text_only_prompts_of_different_lengths_match_the_trainers_logprobs(tmp_path):
    """Left padding must not shift positions: sampled log-probs equal teacher-forced ones."""
    from rlfw.policy import sequence_logprobs
    from rlfw.rollout.types import Segment

    engine, _ = _engine_and_prompts(tmp_path)
    p = engine.processor
    prompts = [Prompt(p.encode_message({"role": "user", "content": text}) + p.generation_prompt_ids, [])
               for text in ("Move.", "You are in a maze. Reach the green square and stop there.")]
    torch.manual_seed(0)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=4))
    segments = [Segment(pr.token_ids + c.token_ids, [0] * len(pr.token_ids) + [1] * len(c.token_ids),
                        [0.0] * len(pr.token_ids) + c.logprobs, []) for pr, c in zip(prompts, out)]
    with torch.no_grad():
        logp, _, _ = sequence_logprobs(engine.model, p, segments)
    for i, (pr, c) in enumerate(zip(prompts, out)):
        n = len(pr.token_ids)
        torch.testing.assert_close(logp[i, n - 1 : n - 1 + len(c.token_ids)], torch.tensor(c.logprobs),
                                   atol=1e-4, rtol=0)
