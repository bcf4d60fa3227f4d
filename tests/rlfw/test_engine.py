"""The transformers engine's own decode loop: identical prompts share one prefill without changing
what any of them generates, greedy decoding equals `model.generate`, and a merged LoRA adapter
gives the same outputs as the unmerged one; model.engine_autocast runs it in bf16."""

import warnings

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import EnvConfig, LoraConfig, ModelConfig
from rlfw.distributed.workers import EngineWorker
from rlfw.models.processing import collate
from rlfw.rollout.agent_loop import turn_message
from rlfw.rollout.types import Prompt, SamplingParams
from tests.rlfw.test_policy_sync import SPEC


def _engine_and_prompts(tmp_path, rank=0, **model_fields):
    env_cfg = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=2, kwargs={"cell_px": 8})
    make_env = make_env_fn(env_cfg)
    model = ModelConfig(name="tiny_vl", tiny=SPEC, lora=LoraConfig(rank=rank, alpha=2 * max(rank, 1)), **model_fields)
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


def test_bf16_engine_autocast_generates_float32s_replies_to_bf16s_rounding(tmp_path):
    """model.engine_autocast=bfloat16: prefill and decode run in bf16, so the log-probs of the same
    greedy replies move by bf16's rounding (nonzero: the matmuls did run in bf16) and no more, and the
    engine's weights stay float32 (they are what a new adapter is merged into)."""
    plain, prompts = _engine_and_prompts(tmp_path / "fp32", rank=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # emulated bf16 where the CPU has none: slower, the same numbers
        bf16, _ = _engine_and_prompts(tmp_path / "bf16", rank=4, engine_autocast="bfloat16")
    assert plain.autocast is None and bf16.autocast == "bfloat16"
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    want, got = plain.generate(prompts * 2, greedy), bf16.generate(prompts * 2, greedy)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    diff = max(abs(g - w) for a, b in zip(got, want) for g, w in zip(a.logprobs, b.logprobs))
    assert 0 < diff < 0.05, diff
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())


def test_copies_of_a_prompt_sample_independently(tmp_path):
    engine, (a, _) = _engine_and_prompts(tmp_path)
    engine.set_seed(0)
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


def test_the_seeded_sampler_draws_from_the_nucleus_distribution():
    """Gumbel-max with one generator per row: frequencies match softmax(logits) renormalised over
    the top_p nucleus, banned tokens never appear."""
    from rlfw.rollout.engine import _sample

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(len(logits))]
    for top_p, banned, want in [(1.0, [], [0.5, 0.3, 0.15, 0.05]), (0.75, [], [0.625, 0.375, 0, 0]),
                                (1.0, [0], [0, 0.6, 0.3, 0.1])]:
        tokens = _sample(logits, torch.tensor(banned, dtype=torch.long), SamplingParams(top_p=top_p), gens)
        freq = torch.bincount(tokens, minlength=4).double() / len(tokens)
        torch.testing.assert_close(freq, torch.tensor(want, dtype=torch.float64), atol=0.012, rtol=0)


def test_a_keyed_request_samples_the_same_whatever_shares_its_batch(tmp_path):
    engine, (a, b) = _engine_and_prompts(tmp_path)
    params = SamplingParams(max_new_tokens=3)
    keyed = lambda p, k: Prompt(p.token_ids, p.images, sample_key=k)
    engine.set_seed(7)
    batch = engine.generate([keyed(a, (i, 0)) for i in range(12)] + [keyed(b, (12, 0))], params)
    engine.set_seed(7)
    alone = engine.generate([keyed(b, (12, 0))], params) + engine.generate([keyed(a, (5, 0))], params)
    assert [c.token_ids for c in alone] == [batch[12].token_ids, batch[5].token_ids]
    assert len({tuple(c.token_ids) for c in batch[:12]}) > 1  # copies of one prompt still differ
    engine.set_seed(8)
    assert [c.token_ids for c in engine.generate([keyed(a, (i, 0)) for i in range(12)], params)] != \
        [c.token_ids for c in batch[:12]]


def test_two_engines_give_the_episodes_of_one(tmp_path):
    """The pool splits a turn's batch across engines, which all get the step's seed: each request
    samples from (seed, episode, turn), so the episodes are those of a single engine."""
    from rlfw.distributed.workers import EnginePool
    from rlfw.rollout.agent_loop import LoopLimits, collect
    from rlfw.rollout.types import Task

    engine, _ = _engine_and_prompts(tmp_path)
    other, _ = _engine_and_prompts(tmp_path / "b")
    serial = lambda parts: [getattr(e, m)(*a) for e, m, a in parts]
    env_cfg = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=4, kwargs={"cell_px": 8})
    make_env = make_env_fn(env_cfg)
    tasks, n = [Task(seed=10**6 + i) for i in range(3)], 4
    limits = LoopLimits(max_turns=4, max_new_tokens=3, max_episode_tokens=4096)
    runs = []
    for pool in (EnginePool([engine], serial), EnginePool([engine, other], serial)):
        pool.set_seed(123)
        eps = collect(pool, engine.processor, [make_env() for _ in range(len(tasks) * n)], tasks, n,
                      SamplingParams(max_new_tokens=3), limits)
        runs.append([(e.actions, [s.token_ids for s in e.segments], [s.logprobs for s in e.segments]) for e in eps])
    assert sum(len(a) for a, _, _ in runs[0]) > len(tasks) * n  # several turns per episode
    assert [(a, t) for a, t, _ in runs[0]] == [(a, t) for a, t, _ in runs[1]]
    for (_, _, x), (_, _, y) in zip(*runs):
        for lx, ly in zip(x, y):
            torch.testing.assert_close(torch.tensor(lx), torch.tensor(ly), atol=1e-5, rtol=0)
