"""Eval sets: VisGym's data file against our env and oracle, solvable counts, generated sets."""

import json

import gymnasium as gym
import pytest

import envs  # noqa: F401
from envs.eval_sets import (
    DATA_FILE,
    HELD_OUT_SEED_START,
    TRAIN_SEEDS,
    EvalSetSpec,
    layout_key,
    load_eval_set,
    reserved_keys,
    solvable_fraction,
    solvable_within,
)
from envs.layout import distances_to, parse_layout
from tests.envs.helpers import CORRIDOR

SETS = {"eval64": "maze_2d/easy", "eval64_hard": "maze_2d/hard"}


@pytest.fixture(scope="module")
def raw():
    with open(DATA_FILE) as f:
        return json.load(f)["sets"]


def env_for(layout, **kwargs):
    return gym.make("rlfw/Maze2D-v0", size=len(layout["grid"]), **kwargs)


@pytest.mark.parametrize("name, size", [("eval64", 9), ("eval64_hard", 11)])
def test_fixed_sets_match_the_data_file(name, size, raw):
    layouts = load_eval_set(name)
    assert layouts == raw[SETS[name]]
    assert [r["seed"] for r in layouts] == list(range(64))
    assert all(len(r["grid"]) == size for r in layouts)


def test_fixed_sets_are_fresh_copies():
    load_eval_set("eval64")[0]["grid"][0] = "mutated"
    assert load_eval_set("eval64")[0]["grid"][0] == "#########"


@pytest.mark.parametrize("name", list(SETS))
def test_bfs_equals_shortest_moves(name):
    for layout in load_eval_set(name):
        walls, agent, target = parse_layout(layout)
        assert distances_to(walls, target)[agent[0]][agent[1]] == layout["shortest_moves"]


@pytest.mark.parametrize("name", list(SETS))
def test_data_oracle_actions_replay_to_reward_one(name):
    for layout in load_eval_set(name):
        env = env_for(layout, max_turns=100)
        env.reset(options={"layout": layout})
        actions = layout["oracle_actions"]
        assert len(actions) == layout["shortest_moves"] + 1
        for i, action in enumerate(actions):
            _, reward, terminated, truncated, info = env.step(action)
            assert not info["wall_bump"] and not info["invalid_action"]
            assert terminated == (i == len(actions) - 1) and not truncated
        assert reward == 1.0 and info["success"] and info["turn"] == layout["shortest_moves"] + 1


@pytest.mark.parametrize("name, difficulty", [("eval64", "easy"), ("eval64_hard", "hard")])
def test_generator_reproduces_visgym_seeds(name, difficulty):
    env = gym.make("rlfw/Maze2D-v0", difficulty=difficulty).unwrapped
    for layout in load_eval_set(name):
        env.reset(seed=layout["seed"])
        ours = env.layout()
        assert (ours["grid"], ours["agent"], ours["target"]) == (
            layout["grid"],
            layout["agent"],
            layout["target"],
        ), layout["seed"]
        assert env.solve() == layout["oracle_actions"]


@pytest.mark.parametrize("max_turns, expected", [(15, 50), (20, 64)])
def test_solvable_counts_and_oracle_within_limit(max_turns, expected):
    layouts = load_eval_set("eval64")
    assert sum(solvable_within(layout, max_turns) for layout in layouts) == expected
    assert solvable_fraction(layouts, max_turns) == expected / 64
    successes = 0
    for layout in layouts:
        env = env_for(layout, max_turns=max_turns)
        env.reset(options={"layout": layout})
        for action in env.unwrapped.solve():
            _, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        assert (reward == 1.0) == solvable_within(layout, max_turns)
        successes += reward == 1.0
    assert successes == expected


def test_solvable_within_computes_missing_shortest_moves():
    assert solvable_within(CORRIDOR, 7) and not solvable_within(CORRIDOR, 6)
    with pytest.raises(ValueError):
        solvable_fraction([], 10)


def test_generated_set_is_held_out_deterministic_and_replayable():
    layouts = load_eval_set("generated", n=6, difficulty="easy")
    assert layouts == load_eval_set("generated", n=6, difficulty="easy")
    assert [r["seed"] for r in layouts] == list(range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 6))
    assert HELD_OUT_SEED_START not in TRAIN_SEEDS and 63 not in TRAIN_SEEDS
    for layout in layouts:
        env = env_for(layout)
        _, info = env.reset(options={"layout": layout})
        assert info["shortest_path"] == layout["shortest_moves"]
    eval_keys = {layout_key(r) for r in load_eval_set("eval64")}
    assert len(eval_keys) == 64


def test_generated_set_other_sizes_and_envs():
    big = load_eval_set("generated", n=2, seed_start=2 * 10**9, size=13)
    assert big[0]["seed"] == 2 * 10**9 and len(big[0]["grid"]) == 13
    goal = load_eval_set("generated", n=2, env_id="rlfw/GridGoal-v0", size=6)
    assert len(goal[1]["grid"]) == 6


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: load_eval_set("generated", n=4, seed_start=0), "HELD_OUT_SEED_START"),
        (lambda: EvalSetSpec(n=0), "n must be"),
        (lambda: load_eval_set("eval65"), "valid values: eval64, eval64_hard, generated"),
        (lambda: load_eval_set("eval64", n=3), "takes no arguments"),
    ],
)
def test_eval_set_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_reserved_keys_cover_the_fixed_sets_and_the_first_heldout_layouts():
    keys = reserved_keys(n_heldout=8)
    for name in ("eval64", "eval64_hard"):
        assert {layout_key(r) for r in load_eval_set(name)} <= keys
    assert {layout_key(r) for r in load_eval_set("generated", n=8)} <= keys
    assert layout_key(load_eval_set("generated", n=1, seed_start=HELD_OUT_SEED_START + 8)[0]) not in keys
