"""Weights of the oracle term by the kind of state a label is on (`algo.oracle_tag_weights`): each
turn records the env's `state_tag()` at the state its prompt showed, a label weighs its tag's
weight, and the term is the weighted token mean (so a tag at weight 0 drops out exactly)."""

import math

import gymnasium as gym
import pytest
import torch

from envs.actions import DELTAS
from rlfw.config import AlgoConfig, EnvConfig
from rlfw.rollout.oracle import oracle_targets, oracle_weights
from rlfw.rollout.types import Task
from rlfw.train import train_batch
from rlfw.validation import ConfigError, validate
from tests.rlfw.inprocess import compose_config, train_rows
from tests.rlfw.scripted import MAX_TURNS, build, play, replay
from tests.rlfw.test_oracle_term import TASKS, _NoOracle, _plan, _policy


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path, processor, make_env = build(tmp_path_factory.mktemp("m"))
    # more tasks than test_oracle_term's, so that the episodes visit junctions as well as corridors
    tasks = TASKS + [Task(seed=2 * 10**6 + i) for i in range(5)]
    return path, processor, make_env, play(processor, make_env, tasks, 2, _plan)


def _open_neighbours(env) -> int:
    """Open squares beside the agent, counted from the layout record (not from envs.layout)."""
    record = env.unwrapped.layout()
    grid, (r, c) = record["grid"], record["agent"]
    return sum(0 <= r + dr < len(grid) and 0 <= c + dc < len(grid[0]) and grid[r + dr][c + dc] == "."
               for dr, dc in DELTAS[:4])


def test_the_tag_is_the_kind_of_square_the_turn_saw(setup):
    _, _, make_env, episodes = setup
    kinds, shifted_differs = set(), 0
    for e in episodes:
        assert len(e.state_tags) == e.turns == MAX_TURNS
        for t in range(e.turns):
            env, _, _ = replay(make_env, e.task, e.actions[:t])
            want = "junction" if _open_neighbours(env) >= 3 else "corridor"
            assert e.state_tags[t] == want, (e.group_id, t)
            kinds.add(want)
            env.step(e.actions[t])  # a tag taken after the step would be this square's
            shifted_differs += ("junction" if _open_neighbours(env) >= 3 else "corridor") != want
    assert kinds == {"junction", "corridor"} and shifted_differs >= 2


def test_a_label_weighs_its_tags_weight():
    assert oracle_weights(["junction", "corridor", None, "junction"], {"junction": 3.0}) == [3.0, 1.0, 1.0, 3.0]
    assert oracle_weights(["junction", "corridor"], {}) == [1.0, 1.0]


def test_a_label_weighed_0_is_left_out_of_the_batch(setup):
    """corridor labels at 0 leave the batch (no forward pass for them); the others keep their weights."""
    _, processor, _, episodes = setup
    _, _, tags = oracle_targets(episodes, processor, "all")
    algo = AlgoConfig(name="grpo", oracle_coef=1.0, oracle_states="all",
                      oracle_tag_weights={"corridor": 0.0, "junction": 3.0})
    batch = train_batch(episodes, torch.zeros(len(episodes)), algo, processor)
    assert len(batch.oracle) == len(batch.oracle_groups) == tags.count("junction") > 0
    assert batch.oracle_weights == [3.0] * tags.count("junction") and tags.count("corridor") > 0


def test_the_term_is_the_weighted_token_mean(setup):
    """SGD, no clipping, zero advantages (only the oracle term moves the weights): all weights 1 is
    the unweighted term; corridors at 0 move the weights exactly as a batch of the junction labels
    alone; junctions at 3 report the weighted mean of the labels' NLLs and move the weights by it."""
    path, processor, _, episodes = setup
    zero = torch.zeros(len(episodes))

    def run(tag_weights, keep=None):
        policy, algo = _policy(path, tasks_per_optimizer_step=64, lr=0.1, max_grad_norm=0.0, oracle_coef=1.0,
                               oracle_states="all", oracle_tag_weights=tag_weights)  # one mini-batch
        policy.trainer.optimizer = torch.optim.SGD(policy.trainer.params, lr=0.1)
        batch = train_batch(episodes, zero, algo, processor)
        if keep is not None:  # only the labels of this tag, unweighted
            _, _, tags = oracle_targets(episodes, processor, "all")
            chosen = [k for k, tag in enumerate(tags) if tag == keep]
            batch.oracle = [batch.oracle[k] for k in chosen]
            batch.oracle_groups = [batch.oracle_groups[k] for k in chosen]
            batch.oracle_weights = [1.0] * len(chosen)
        start = policy.trainable_state()
        nll = [-float(torch.as_tensor(lp)[torch.tensor(s.loss_mask[1:]).bool()].sum())
               for lp, s in zip(policy.logprobs(batch.oracle), batch.oracle)]
        stats = policy.update(batch, step=1, seed=0)
        move = {k: v - start[k] for k, v in policy.trainable_state().items()}
        return move, stats["oracle_loss"], batch, nll

    plain, plain_loss, batch, nll = run({})
    tokens = [sum(s.loss_mask[1:]) for s in batch.oracle]
    assert plain_loss == pytest.approx(sum(nll) / sum(tokens), rel=1e-5)
    ones, _, _, _ = run({"junction": 1.0, "corridor": 1.0})
    junctions_only, _, _, _ = run({"corridor": 0.0})
    alone, _, _, _ = run({}, keep="junction")
    heavy, heavy_loss, batch, nll = run({"junction": 3.0})
    w = batch.oracle_weights
    assert sorted(set(w)) == [1.0, 3.0]
    weighted = sum(wi * n for wi, n in zip(w, nll)) / sum(wi * t for wi, t in zip(w, tokens))
    assert heavy_loss == pytest.approx(weighted, rel=1e-5)
    assert not math.isclose(weighted, sum(nll) / sum(tokens), rel_tol=5e-5)  # so an ignored weight fails it
    for name in plain:
        torch.testing.assert_close(ones[name], plain[name], atol=1e-7, rtol=1e-5)
        torch.testing.assert_close(junctions_only[name], alone[name], atol=1e-7, rtol=1e-5)
    assert any(float((heavy[n] - plain[n]).abs().max()) > 1e-5 for n in plain)
    assert any(float((junctions_only[n] - plain[n]).abs().max()) > 1e-5 for n in plain)


def test_bad_tag_weights_are_refused_before_anything_runs(tmp_path):
    base = ["experiment=debug", "algo.oracle_coef=1"]
    for overrides, needle in [(base + ["+algo.oracle_tag_weights.junction=-1"], r"junction=-1.0 must be a finite"),
                              (base + ["+algo.oracle_tag_weights.junction=nan"], r"junction=nan must be a finite"),
                              (base + ["+algo.oracle_tag_weights.junction=inf"], r"junction=inf must be a finite"),
                              (["experiment=debug", "+algo.oracle_tag_weights.junction=3"], "needs algo.oracle_coef > 0"),
                              (base + ["+algo.oracle_tag_weights.junctoin=3"], r"names \['junctoin'\], which")]:
        with pytest.raises(ConfigError, match=needle):
            compose_config(tmp_path, *overrides)
    # The main job weighs junction labels 10; its outcome-only variant removes the weight as the error says.
    with pytest.raises(ConfigError, match=r"remove them: '~algo.oracle_tag_weights.junction'"):
        compose_config(tmp_path, "experiment=maze_sft_then_dagger", "algo.oracle_coef=0")
    staged = compose_config(tmp_path, "experiment=maze_sft_then_dagger", "algo.oracle_coef=0",
                            "~algo.oracle_tag_weights.junction")
    assert staged.algo.oracle_tag_weights == {}
    cfg = compose_config(tmp_path, *base, "+algo.oracle_tag_weights={junction:3,corridor:0.5}")
    assert dict(cfg.algo.oracle_tag_weights) == {"junction": 3.0, "corridor": 0.5}
    if "rlfw_test/NoOracle-v0" not in gym.registry:
        gym.register(id="rlfw_test/NoOracle-v0", entry_point=_NoOracle)
    cfg.env = EnvConfig(name="custom", id="rlfw_test/NoOracle-v0", max_turns=3, eval_set="heldout")
    with pytest.raises(ConfigError, match=r"has no best_action\(\) or state_tag\(\)"):
        validate(cfg)


def test_a_run_with_tag_weights_logs_the_labels_mean_weight(tmp_path):
    rows = train_rows(tmp_path / "run", "algo.oracle_coef=0.5", "algo.oracle_states=all",
                      "+algo.oracle_tag_weights.junction=3")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(1 <= r["train/oracle_weight_mean"] <= 3 and r["policy/oracle_loss"] > 0 for r in rows)


def test_tag_states_label_every_visited_state_of_those_kinds_beside_the_first_errors(setup):
    """first_error + oracle_tag_states=[junction]: each episode's first wrong turn and every junction turn,
    once each, in turn order, each labelled with the oracle's move at that turn's own state."""
    _, processor, _, episodes = setup
    segments, groups, tags = oracle_targets(episodes, processor, "first_error", ["junction"])
    want, k = [], 0
    for e in episodes:
        first = [t for t, (o, p) in enumerate(zip(e.oracle_actions, e.parsed_actions)) if o is not None and p != o][:1]
        turns = sorted(set(first) | {t for t, tag in enumerate(e.state_tags) if tag == "junction"})
        want += [(e.group_id, e.state_tags[t]) for t in turns]
        for t in turns:  # the prompt is turn t's, the answer the oracle's move there
            seg, own = segments[k], e.segments[t]
            prompt = len(own.token_ids) - sum(own.loss_mask)
            assert seg.token_ids[:prompt] == own.token_ids[:prompt]
            assert processor.tokenizer.decode(seg.token_ids[prompt:-1]) == e.oracle_actions[t]
            k += 1
    assert list(zip(groups, tags)) == want and k == len(segments)
    assert "junction" in tags and "corridor" in tags  # first errors in corridors stay labelled
    assert len(segments) > len(oracle_targets(episodes, processor, "first_error")[0])


def test_tag_states_are_refused_without_the_term_or_with_a_tag_the_env_lacks(tmp_path):
    base = ["experiment=debug", "algo.oracle_coef=1"]
    with pytest.raises(ConfigError, match=r"oracle_tag_states=\['junction'\] adds labels .* needs algo.oracle_coef > 0"):
        compose_config(tmp_path, "experiment=debug", "algo.oracle_tag_states=[junction]")
    with pytest.raises(ConfigError, match=r"algo.oracle_tag_states names \['junctoin'\], which"):
        compose_config(tmp_path, *base, "algo.oracle_tag_states=[junctoin]")
    assert compose_config(tmp_path, *base, "algo.oracle_tag_states=[junction]").algo.oracle_tag_states == ["junction"]
