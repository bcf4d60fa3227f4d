"""The update's bookkeeping: micro-batch weighting is exact, the LR schedule has the configured shape,
and dynamic sampling keeps only groups whose rewards differ."""

import math

import pytest
import torch

from rlfw.config import AlgoConfig, Config, EnvConfig, LoraConfig, ModelConfig, TinyVLSpec
from rlfw.schedule import lr_factor
from rlfw.rollout.types import Completion, TrainBatch
from tests.rlfw.test_policy_sync import _setup


@pytest.mark.parametrize("reduction", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_split_does_not_change_the_update(tmp_path, reduction):
    """One big micro-batch and micro-batches of 1 give the same parameters after an update. SGD is
    linear in the gradient, so it shows the micro-batch weighting exactly; AdamW divides by sqrt(v),
    which turns float noise in a near-zero gradient element into a visible step, so under AdamW
    only the bulk of the elements is compared tightly (a weighting bug moves nearly all of them)."""
    for optimizer in ("sgd", "adamw"):
        results = []
        for micro in (64, 1):
            algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=2,
                              sequences_per_forward=micro, loss_reduction=reduction)
            policy, _, segments, groups = _setup(tmp_path / f"{optimizer}{micro}", 4, algo)
            if optimizer == "sgd":
                policy.trainer.optimizer = torch.optim.SGD(policy.trainer.params, lr=1e-1)
            advantages = [1.0 if i % 3 == 0 else -0.5 for i in range(len(segments))]
            batch = TrainBatch(segments, advantages, groups)
            policy.update(batch, step=1, seed=7)
            policy.update(batch, step=2, seed=8)  # second step: LoRA A moves too
            results.append(policy.trainable_state())
        for name in results[0]:
            if optimizer == "sgd":
                torch.testing.assert_close(results[0][name], results[1][name], atol=1e-6, rtol=1e-5)
            else:
                diff = (results[0][name] - results[1][name]).abs()
                assert float((diff > 1e-6).float().mean()) < 0.02, name


@pytest.mark.parametrize("old_logprobs", ["trainer", "rollout"])
def test_duplicate_segments_share_a_forward_pass_without_changing_the_update(tmp_path, old_logprobs):
    """Copies of a segment with different advantages (signs included) give the same update whether
    each copy gets its own forward pass or all copies share one; two mini-batches exercise the
    PPO ratio with old log-probs from the trainer or from the rollout."""
    results, stats = [], []
    for dedup in (True, False):
        algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=1, sequences_per_forward=3,
                          old_logprobs=old_logprobs)
        policy, _, segments, groups = _setup(tmp_path / f"d{dedup}", 4, algo)
        # every segment three times in its group, with advantages of both signs
        segments3 = [s for s in segments for _ in range(3)]
        groups3 = [g for g in groups for _ in range(3)]
        advantages = [(-1.0) ** i * (1 + i % 5) for i in range(len(segments3))]
        policy.trainer.dedup = dedup
        forwards = []
        real_forward = policy.trainer._forward
        policy.trainer._forward = lambda segs, *a, **k: forwards.append(len(segs)) or real_forward(segs, *a, **k)
        stats.append(policy.update(TrainBatch(segments3, advantages, groups3), step=1, seed=3))
        results.append(policy.trainable_state())
        assert sum(forwards) == (1 if dedup else 3) * len(segments) * (2 if old_logprobs == "trainer" else 1)
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], atol=1e-6, rtol=1e-4)
    for key in ("loss", "entropy", "grad_norm"):
        assert stats[0][key] == pytest.approx(stats[1][key], rel=1e-4, abs=1e-7)


def test_lr_is_a_function_of_the_training_step(tmp_path):
    """A step that made no update (its episodes were all dropped) does not shift the schedule: the
    first update made, at step 4, uses step 4's LR."""
    algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=2, sequences_per_forward=8,
                      lr_schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    policy, _, segments, groups = _setup(tmp_path, 4, algo)
    stats = policy.update(TrainBatch(segments, [1.0] * len(segments), groups), step=4)
    assert stats["lr"] == pytest.approx(1e-2 * lr_factor(3, 4, warmup_steps=2, decay_steps=2, min_ratio=0.1))
    assert policy.trainer.lr_at(1) == pytest.approx(0.5e-2)  # warmup: (0 + 1) / 2
    # trainer.schedule=minutes: the cosine on the fraction of the time spent, whatever total_steps is
    stats = policy.update(TrainBatch(segments, [1.0] * len(segments), groups), step=4, lr_progress=0.25)
    assert stats["lr"] == pytest.approx(1e-2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25))))
    assert policy.trainer.lr_at(1, progress=0.9) == pytest.approx(0.5e-2)  # warmup still counts steps


def test_kl_term_is_reduced_with_the_policy_terms_token_budget(tmp_path):
    """Dr. GRPO (seq-mean-token-sum over a constant): the KL term is divided by the same
    loss_max_tokens as the policy term, on the very same weights."""
    import dataclasses

    algo = AlgoConfig(name="dr_grpo", lr=5e-2, tasks_per_step=2, tasks_per_optimizer_step=2,
                      sequences_per_forward=8, loss_reduction="seq-mean-token-sum", use_kl_loss=True)
    policy, _, segments, groups = _setup(tmp_path, 4, algo)
    batch = TrainBatch(segments, [1.0 if i % 2 else -1.0 for i in range(len(segments))], groups)
    policy.update(batch, step=1)  # move the adapter away from the reference (adapter off)
    moved = policy.trainer.state_dict()
    kl = {}
    for budget in (None, 4):
        policy.trainer.load_state_dict(moved)
        policy.trainer.algo = dataclasses.replace(algo, loss_max_tokens=budget)
        kl[budget] = policy.update(batch, step=2)["kl"]
    assert kl[None] > 0
    assert kl[4] == pytest.approx(kl[None] / 4, rel=1e-5)


def test_non_finite_loss_makes_no_optimizer_step(tmp_path, nan_policy_loss):
    algo = AlgoConfig(name="grpo", lr=1e-2, tasks_per_step=2, tasks_per_optimizer_step=1, sequences_per_forward=8,
                      policy_loss_type=nan_policy_loss)
    policy, _, segments, groups = _setup(tmp_path, 4, algo)
    before = policy.trainable_state()
    stats = policy.update(TrainBatch(segments, [1.0] * len(segments), groups), step=1)
    assert stats["nonfinite"] == 1.0 and stats["optimizer_steps"] == 0 and stats["skipped"] == 0.0
    after = policy.trainable_state()
    assert all(torch.equal(before[k], after[k]) for k in before)


class _ScriptedEngine:
    """Replies stop to every prompt: episodes on their target succeed, the rest fail at once."""

    def __init__(self, processor):
        self.stop = processor.tokenizer.encode("('stop', 'stop')", add_special_tokens=False)
        self.eos = processor.eos_token_id

    def set_seed(self, seed):
        pass

    def generate(self, prompts, params):
        return [Completion(self.stop + [self.eos], [-0.1, -0.1], True) for _ in prompts]


def test_dynamic_sampling_drops_constant_groups(tmp_path, monkeypatch):
    from rlfw import train as train_mod
    from rlfw.build import make_env_fn, prepare_base_model
    from rlfw.models.processing import PolicyProcessor
    from rlfw.rollout.types import Task

    env = EnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=2, kwargs={"cell_px": 8})
    model = ModelConfig(name="tiny_vl", tiny=TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128),
                        lora=LoraConfig(rank=0))
    make_env = make_env_fn(env)
    processor = PolicyProcessor.from_pretrained(prepare_base_model(model, make_env, tmp_path, 0))
    # every task starts off the target, so "stop" fails in every episode: all groups are constant
    monkeypatch.setattr(train_mod, "training_tasks",
                        lambda seed, step, r, n, allowed=None: [Task(seed=10**6 + i) for i in range(n)])
    for mode, expected_rounds in [("drop", 1), ("resample", 3)]:
        cfg = Config(algo=AlgoConfig(name="dapo", n_samples_per_prompt=2, tasks_per_step=2, tasks_per_optimizer_step=2,
                                     dynamic_sampling=mode, max_sample_rounds=3), env=env, model=model)
        episodes, rounds = train_mod.rollout_step(cfg, 1, _ScriptedEngine(processor), processor,
                                                  [make_env() for _ in range(4)], {})
        assert episodes == [] and rounds == expected_rounds
    cfg.algo.dynamic_sampling = "off"
    episodes, rounds = train_mod.rollout_step(cfg, 1, _ScriptedEngine(processor), processor,
                                              [make_env() for _ in range(4)], {})
    assert len(episodes) == 4 and rounds == 1 and not any(e.success for e in episodes)


def test_target_kl_stops_the_remaining_optimizer_steps(tmp_path):
    """Four mini-batches at a large LR: without a target every one steps; with a tiny target the
    first steps (it starts on-policy) and the second, already drifted, stops the rest."""
    counts = {}
    for target in (None, 1e-9):
        algo = AlgoConfig(name="grpo", lr=5e-2, tasks_per_step=2, tasks_per_optimizer_step=1, sequences_per_forward=8,
                          update_epochs=2, target_kl=target)
        policy, _, segments, groups = _setup(tmp_path / f"t{target}", 4, algo)
        advantages = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
        stats = policy.update(TrainBatch(segments, advantages, groups), step=1, seed=1)
        counts[target] = (stats["optimizer_steps"], stats["skipped"])
        assert stats["rollout_logp_abs_diff"] < 1e-3  # the engine sampled from the trainer's weights
    assert counts[None] == (4, 0.0)
    assert counts[1e-9] == (1, 1.0)


def test_logits_only_where_the_loss_is(tmp_path):
    """sequence_logprobs projects to the vocabulary only the positions that predict a generated
    token (no [B, T, V] logits), with the values of a full forward pass there and 0 elsewhere."""
    from rlfw.policy import sequence_logprobs

    algo = AlgoConfig(name="grpo", tasks_per_step=2, tasks_per_optimizer_step=2)
    policy, _, segments, _ = _setup(tmp_path, 4, algo)
    model, processor = policy.trainer.model, policy.trainer.processor
    rows = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda mod, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    with torch.no_grad():
        logp, mask, entropy = sequence_logprobs(model, processor, segments, want_entropy=True)
    hook.remove()
    assert rows == [int(mask.sum())] and rows[0] < mask.numel() / 10
    # reference: full logits
    from rlfw.models.processing import collate

    feats = [[processor.image_features(im) for im in s.images] for s in segments]
    batch = collate([s.token_ids for s in segments], feats, processor.image_token_id, processor.pad_token_id, left_pad=False)
    with torch.no_grad():
        full = torch.log_softmax(model(**batch).logits[:, :-1].float(), -1)
    want = full.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1) * mask
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=0)
    assert float(entropy[mask == 0].abs().sum()) == 0 and float(entropy[mask == 1].min()) > 0
