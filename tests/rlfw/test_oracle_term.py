"""The DAgger-style oracle term (`algo.oracle_coef`, rlfw/rollout/oracle.py): labels are the oracle's
move at the state each turn saw, the oracle segment is the turn's prompt + the oracle action + EOS,
the update pushes the oracle action up, independently of the micro-batch split, and the run logs it."""


import gymnasium as gym
import pytest
import torch

from envs.actions import STOP
from rlfw.config import AlgoConfig, EnvConfig, repo_root
from rlfw.distributed.workers import PolicyWorker
from rlfw.rollout.oracle import oracle_targets
from rlfw.rollout.types import Task
from rlfw.rollout.demos import to_segment
from rlfw.rollout.types import segment_key
from rlfw.train import train_batch
from rlfw.validation import ConfigError, validate
from tests.rlfw.inprocess import compose_config, train_rows
from tests.rlfw.scripted import MAX_TURNS, MODEL, build, play, replay

TASKS = [Task(seed=10**6 + i) for i in range(3)]


def _plan(episode: int, turn: int, env) -> str:
    """Agree with the oracle on every other turn (never stopping), else a wrong move: one of the
    other moves (into a wall or not), or an invalid reply."""
    u = env.unwrapped
    oracle = u.best_action()
    if (episode + turn) % 2 == 0 and oracle != u.action_strings[STOP]:
        return oracle
    if turn % 3 == 0:
        return "no idea"
    others = [a for a in u.action_strings[:STOP] if a != oracle]
    return others[(episode + turn) % len(others)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path, processor, make_env = build(tmp_path_factory.mktemp("m"))
    return path, processor, make_env, play(processor, make_env, TASKS, 2, _plan)


def test_the_label_is_the_oracle_move_at_the_state_the_turn_saw(setup):
    _, _, make_env, episodes = setup
    shifted_differs = 0
    for e in episodes:
        assert len(e.oracle_actions) == len(e.parsed_actions) == e.turns == MAX_TURNS
        for t in range(e.turns):
            env, _, _ = replay(make_env, e.task, e.actions[:t])
            assert e.oracle_actions[t] == env.unwrapped.best_action(), (e.group_id, t)
            env.step(e.actions[t])  # the next state: a label taken after the step would be this one
            shifted_differs += env.unwrapped.best_action() != e.oracle_actions[t]
        assert e.parsed_actions == [None if a == "no idea" else a for a in e.actions]
    assert shifted_differs >= 3  # so an off-by-one label cannot pass


def test_the_oracle_segment_is_the_turns_prompt_then_the_oracle_action_and_eos(setup):
    _, processor, make_env, episodes = setup
    segments, groups, _ = oracle_targets(episodes, processor, "all")
    assert len(segments) == sum(e.turns for e in episodes)
    k = 0
    for e in episodes:
        for t in range(e.turns):
            env, image, feedback = replay(make_env, e.task, e.actions[:t])
            want = to_segment(processor, image, env.unwrapped.prompt(), feedback, e.oracle_actions[t])
            got = segments[k]
            assert got.token_ids == want.token_ids and got.loss_mask == want.loss_mask, (e.group_id, t)
            assert all((a == b).all() for a, b in zip(got.images, want.images)) and len(got.images) == 1
            loss_tokens = [i for i, m in zip(got.token_ids, got.loss_mask) if m]
            oracle_ids = processor.tokenizer.encode(e.oracle_actions[t], add_special_tokens=False)
            assert loss_tokens == oracle_ids + [processor.eos_token_id]
            # the same prompt as the turn the policy played
            turn = e.segments[t]
            prompt = len(turn.token_ids) - sum(turn.loss_mask)
            assert got.token_ids[: len(got.token_ids) - len(loss_tokens)] == turn.token_ids[:prompt]
            assert groups[k] == e.group_id
            k += 1


def test_errors_labels_only_the_turns_whose_move_was_not_the_oracles(setup):
    _, processor, _, episodes = setup
    segments, groups, _ = oracle_targets(episodes, processor, "errors")
    turns = [(i, t) for i, e in enumerate(episodes) for t in range(e.turns)]
    wrong = [(i, t) for i, t in turns if episodes[i].parsed_actions[t] != episodes[i].oracle_actions[t]]
    assert 0 < len(wrong) < len(turns)  # the plan mixes both
    assert len(segments) == len(wrong) and groups == [episodes[i].group_id for i, _ in wrong]
    every, _, _ = oracle_targets(episodes, processor, "all")
    at = dict(zip(turns, every))
    assert [s.token_ids for s in segments] == [at[w].token_ids for w in wrong]


def _policy(path, tasks_per_optimizer_step=3, **algo):
    cfg = AlgoConfig(name="grpo", tasks_per_step=3, tasks_per_optimizer_step=tasks_per_optimizer_step, **algo)
    return PolicyWorker(MODEL, cfg, path, total_steps=4, seed=0, torch_threads=1), cfg


def _oracle_logp(policy, segments) -> float:
    """Mean log-prob per loss token of `segments` under the trainer's weights."""
    lps = policy.logprobs(segments)
    return float(sum(torch.as_tensor(lp)[torch.tensor(s.loss_mask[1:]).bool()].sum() for lp, s in zip(lps, segments))
                 / sum(sum(s.loss_mask[1:]) for s in segments))


def test_the_oracle_term_raises_the_oracle_actions_log_prob(setup):
    """With zero advantages the policy term has no gradient, so only the oracle term moves the
    weights: up on the oracle actions, reported as their token-mean NLL before the step. Off, there
    are no oracle segments and no forward pass beyond the policy's own."""
    path, processor, _, episodes = setup
    zero = torch.zeros(len(episodes))
    policy, algo = _policy(path, lr=1e-2, oracle_coef=1.0, oracle_states="errors")
    batch = train_batch(episodes, zero, algo, processor)
    assert 0 < len(batch.oracle) < len(batch.segments)
    before = _oracle_logp(policy, batch.oracle)
    stats = policy.update(batch, step=1, seed=0)
    assert stats["oracle_loss"] == pytest.approx(-before, rel=1e-5)
    assert _oracle_logp(policy, batch.oracle) > before + 0.05

    policy, algo = _policy(path, lr=1e-2)
    batch = train_batch(episodes, zero, algo, processor)
    assert batch.oracle == []
    forwards = []
    real_forward = policy.trainer._forward
    policy.trainer._forward = lambda segs, *a, **k: forwards.append(len(segs)) or real_forward(segs, *a, **k)
    start = policy.trainable_state()
    stats = policy.update(batch, step=1, seed=0)
    assert "oracle_loss" not in stats
    distinct = len({segment_key(s) for s in batch.segments})
    assert sum(forwards) == distinct  # the policy's forward passes only
    assert all(torch.equal(start[k], v) for k, v in policy.trainable_state().items())


def test_the_oracle_term_does_not_depend_on_the_micro_batch_split(setup):
    """SGD (linear in the gradient): one micro-batch, micro-batches of one, and no deduplication of
    the repeated oracle segments give the same weights, with a policy term beside the oracle term;
    one mini-batch per group, each holding that group's oracle segments only."""
    path, processor, _, episodes = setup
    episodes = episodes + episodes[:2]  # repeated turns: copies must count once each
    advantages = torch.tensor([(-1.0) ** i * (1 + i % 3) for i in range(len(episodes))])
    results = []
    for micro, dedup in [(64, True), (1, True), (3, False)]:
        policy, algo = _policy(path, tasks_per_optimizer_step=1, lr=1e-2, oracle_coef=0.7, oracle_states="all",
                               sequences_per_forward=micro)
        trainer = policy.trainer
        trainer.optimizer = torch.optim.SGD(trainer.params, lr=0.5)
        trainer.dedup = dedup
        batch = train_batch(episodes, advantages, algo, processor)
        minis = []
        real_step = trainer._optimizer_step
        trainer._optimizer_step = lambda segs, keys, adv, old, ref, idx, oracle: minis.append(
            ({batch.groups[i] for i in idx}, {batch.oracle_groups[k] for k in oracle[2]}, len(oracle[2]))
        ) or real_step(segs, keys, adv, old, ref, idx, oracle)
        stats = [policy.update(batch, step=s, seed=s) for s in (1, 2)]
        assert len(minis) == 6 and all(len(g) == 1 and g == og for g, og, _ in minis)
        assert sum(n for _, _, n in minis) == 2 * len(batch.oracle) == 2 * sum(e.turns for e in episodes)
        results.append((policy.trainable_state(), stats[0]["oracle_loss"]))
    for state, loss in results[1:]:
        assert loss == pytest.approx(results[0][1], rel=1e-5)
        for name in state:
            torch.testing.assert_close(state[name], results[0][0][name], atol=1e-6, rtol=1e-5)


def test_the_policy_gradient_weight_scales_its_term_and_off_leaves_the_oracle_term(setup):
    """algo.pg_coef: with SGD and no clipping an update is linear in the loss, so the weights' move
    with the policy term at c is c times its move at 1, and at 0 beside the oracle term it is the
    combined move less the policy term's own (the oracle and entropy terms unscaled); the policy
    term alone raises the advantage-weighted log-likelihood of the sampled turns. A sign flip or an
    ignored weight fails it."""
    path, processor, _, episodes = setup
    advantages = torch.tensor([(-1.0) ** i * (1 + i % 3) for i in range(len(episodes))])
    objective = []  # sum of advantage * token log-probs of the sampled turns, before and after

    def delta(**algo):
        policy, cfg = _policy(path, lr=0.1, max_grad_norm=0.0, oracle_states="errors", **algo)
        policy.trainer.optimizer = torch.optim.SGD(policy.trainer.params, lr=0.1)  # the step sets algo.lr
        batch = train_batch(episodes, advantages, cfg, processor)
        weighted = lambda: sum(adv * float(torch.as_tensor(lp)[torch.tensor(s.loss_mask[1:]).bool()].sum())
                               for adv, lp, s in zip(batch.advantages, policy.logprobs(batch.segments), batch.segments))
        start, before = policy.trainable_state(), weighted()
        policy.update(batch, step=1, seed=0)
        objective.append((before, weighted()))
        return {k: v - start[k] for k, v in policy.trainable_state().items()}

    pg, half, both, oracle_only = (delta(), delta(pg_coef=0.5), delta(oracle_coef=1.0, entropy_coef=0.05),
                                   delta(oracle_coef=1.0, entropy_coef=0.05, pg_coef=0.0))
    assert any(float(v.abs().max()) > 1e-4 for v in pg.values())
    assert objective[0][1] > objective[0][0] + 1e-3
    for name in pg:
        torch.testing.assert_close(half[name], 0.5 * pg[name], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(oracle_only[name], both[name] - pg[name], atol=1e-6, rtol=1e-4)
    assert any(float((oracle_only[n] - both[n]).abs().max()) > 1e-4 for n in pg)


def test_dagger_alone_forwards_the_oracle_segments_only(setup):
    """algo.pg_coef=0 with no entropy or KL term and target_kl=null reads nothing of the sampled
    turns: the update forwards its oracle segments alone (no old log-probs either, over three
    mini-batches) and moves the weights as the same update that also forwards the sampled turns
    (a target_kl too high to stop anything) does, with SGD and no clipping."""
    path, processor, _, episodes = setup
    advantages = torch.tensor([(-1.0) ** i * (1 + i % 3) for i in range(len(episodes))])
    moves, forwarded = {}, {}
    for name, target_kl in [("oracle only", None), ("every turn", 1e9)]:
        policy, cfg = _policy(path, tasks_per_optimizer_step=1, lr=0.1, max_grad_norm=0.0, oracle_states="errors",
                              oracle_coef=1.0, pg_coef=0.0, target_kl=target_kl)
        policy.trainer.optimizer = torch.optim.SGD(policy.trainer.params, lr=0.1)  # the step sets algo.lr
        batch = train_batch(episodes, advantages, cfg, processor)
        assert 0 < len(batch.oracle) < len(batch.segments)
        seen = forwarded[name] = []
        real_forward = policy.trainer._forward
        policy.trainer._forward = lambda segs, *a, **k: seen.extend(segs) or real_forward(segs, *a, **k)
        start = policy.trainable_state()
        stats = policy.update(batch, step=1, seed=0)
        assert stats["nonfinite"] == 0 and stats["oracle_loss"] > 0 and stats["optimizer_steps"] == 3
        assert ("loss" in stats) == (target_kl is not None)
        moves[name] = {k: v - start[k] for k, v in policy.trainable_state().items()}
        oracle = {segment_key(s) for s in batch.oracle}
        if target_kl is None:
            assert seen and {segment_key(s) for s in seen} <= oracle
        else:
            assert any(segment_key(s) not in oracle for s in seen)
    assert any(float(v.abs().max()) > 1e-4 for v in moves["oracle only"].values())
    for name, move in moves["oracle only"].items():
        torch.testing.assert_close(move, moves["every turn"][name], atol=1e-6, rtol=1e-4)


def test_bad_oracle_settings_are_refused_before_anything_runs(tmp_path):
    for overrides, needle in [(["algo.oracle_coef=0.5", "env.history=full"], "need env.history=none"),
                              (["algo.oracle_states=sometimes"], "algo.oracle_states"),
                              (["algo.oracle_coef=-1"], "algo.oracle_coef=-1.0 must be >= 0"),
                              (["algo.pg_coef=-1"], "algo.pg_coef=-1.0 must be >= 0"),
                              (["algo.pg_coef=nan"], "algo.pg_coef=nan must be >= 0"),
                              (["algo.pg_coef=0", "algo.entropy_coef=0.01"], "nothing to train without the oracle"),
                              (["algo.pg_coef=0", "algo.oracle_coef=1", "algo.dynamic_sampling=drop"],
                               "algo.dynamic_sampling=drop acts through the advantages")]:
        with pytest.raises(ConfigError, match=needle):
            compose_config(tmp_path, "experiment=debug", *overrides)
    compose_config(tmp_path, "experiment=debug", "algo.pg_coef=0", "algo.oracle_coef=1")  # DAgger alone
    if "rlfw_test/NoOracle-v0" not in gym.registry:
        gym.register(id="rlfw_test/NoOracle-v0", entry_point=_NoOracle)
    cfg = compose_config(tmp_path, "experiment=debug")
    cfg.env = EnvConfig(name="custom", id="rlfw_test/NoOracle-v0", max_turns=3, eval_set="heldout")
    cfg.algo.oracle_coef = 0.5
    with pytest.raises(ConfigError, match=r"has no best_action\(\)"):
        validate(cfg)


class _NoOracle(gym.Env):
    """Stands in for a generic env: no best_action(), no layout()."""

    observation_space = gym.spaces.Discrete(1)
    action_space = gym.spaces.Discrete(1)

    def __init__(self, max_turns: int = 3):
        self.max_turns = max_turns


def test_a_run_with_the_oracle_term_logs_it(tmp_path):
    rows = train_rows(tmp_path / "run", "algo.oracle_coef=0.5", "algo.oracle_states=all")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        turns = r["train/turns_mean"] * r["train/episodes"]
        assert r["train/oracle_states"] == pytest.approx(turns)  # all: every visited turn
        assert 0 <= r["train/oracle_disagreement"] <= 1 and r["policy/oracle_loss"] > 0


def test_the_dagger_preset_is_maze_from_sft_with_the_oracle_term(tmp_path):
    """maze_from_sft plus the oracle term, the training forward's speed settings and the step count
    that they fit in the measured run's time (levers.md); nothing else."""
    base = compose_config(tmp_path, "experiment=maze_from_sft")
    dagger = compose_config(tmp_path, "experiment=maze_from_sft_dagger")
    assert base.algo.oracle_coef == 0 and dagger.algo.oracle_coef > 0 and dagger.algo.oracle_states == "first_error"
    assert dagger.trainer.total_steps == 340
    m = dagger.model
    assert (m.attn_implementation, m.train_autocast, m.compile) == ("eager", "auto", True)
    dagger.algo.oracle_coef, dagger.algo.oracle_states = 0.0, base.algo.oracle_states
    dagger.trainer.total_steps = base.trainer.total_steps
    m.attn_implementation, m.train_autocast, m.compile = None, None, False
    assert dagger == base


def test_each_state_choice_labels_the_turns_it_names():
    """errors: every disagreeing turn; first_error: only the first; all: every turn with a label.
    Each chosen turn's segment is that turn's prompt followed by the oracle's move."""
    from rlfw.models.processing import PolicyProcessor
    from rlfw.rollout.oracle import oracle_targets
    from rlfw.rollout.types import Episode, Segment, Task

    processor = PolicyProcessor.from_pretrained(f"{repo_root()}/checkpoints/tiny_vl_maze_sft")
    stop = processor.tokenizer.encode("x", add_special_tokens=False)
    e = Episode(task=Task(seed=1), group_id=3)
    turns = [("right", "right"), ("up", "left"), ("up", "up"), ("down", None), ("stop", "stop")]
    for t, (oracle, played) in enumerate(turns):
        e.segments.append(Segment([100 + t, 7] + stop, [0, 0] + [1] * len(stop), [0.0] * (2 + len(stop)), []))
        e.oracle_actions.append(oracle)
        e.parsed_actions.append(played)
    e.oracle_actions.append(None)  # a turn without a label is never chosen
    e.parsed_actions.append("up")
    e.segments.append(Segment([99, 7] + stop, [0, 0] + [1] * len(stop), [0.0] * (2 + len(stop)), []))
    for states, want in [("errors", [1, 3]), ("first_error", [1]), ("all", [0, 1, 2, 3, 4])]:
        segments, groups, _ = oracle_targets([e], processor, states)
        assert [s.token_ids[0] - 100 for s in segments] == want and groups == [3] * len(want), states
        for s, t in zip(segments, want):
            answer = processor.tokenizer.encode(turns[t][0], add_special_tokens=False) + [processor.eos_token_id]
            assert s.token_ids == [100 + t, 7] + answer and s.loss_mask == [0, 0] + [1] * len(answer)
