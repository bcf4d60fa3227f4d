"""rlfw/Maze2D-v0: dynamics on a hand-built maze, generation, bad kwargs and bad layouts."""

import copy

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence

import envs  # noqa: F401
from envs.actions import OUT_OF_TURNS_FEEDBACK, WALL_FEEDBACK, invalid_action_feedback
from envs.maze2d import Maze2DEnv
from tests.envs.helpers import CORRIDOR, CORRIDOR_SOLUTION

RIGHT, UP, LEFT, DOWN = "('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)"
STOP = "('stop', 'stop')"


def corridor_env(**kwargs):
    env = gym.make("rlfw/Maze2D-v0", size=5, **kwargs)
    obs, info = env.reset(options={"layout": CORRIDOR})
    return env, obs, info


def test_canonical_action_strings():
    assert Maze2DEnv().action_strings == (RIGHT, UP, LEFT, DOWN, STOP)


def test_reset_gives_prompt_and_info():
    env, obs, info = corridor_env()
    assert obs["image"].shape == (125, 125, 3) and obs["image"].dtype == np.uint8
    assert obs["text"] == env.unwrapped.prompt()
    assert "('move', 0) = move right" in obs["text"] and "('stop', 'stop')" in obs["text"]
    assert info == {
        "success": False,
        "agent": (3, 1),
        "target": (3, 3),
        "shortest_path": 6,
        "turn": 0,
        "invalid_action": False,
        "wall_bump": False,
        "action": None,
    }


def test_wall_bump_costs_a_turn_and_stays():
    env, _, _ = corridor_env()
    obs, reward, terminated, truncated, info = env.step(RIGHT)  # (3, 2) is a wall
    assert WALL_FEEDBACK in obs["text"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["agent"] == (3, 1) and info["wall_bump"] and info["turn"] == 1
    assert info["action"] == RIGHT and not info["invalid_action"]


def test_valid_move_updates_agent_and_shortest_path():
    env, _, _ = corridor_env()
    obs, _, _, _, info = env.step("I will go ('move', 1)")
    assert obs["text"] == "Moved up."
    assert info["agent"] == (2, 1) and info["shortest_path"] == 5 and not info["wall_bump"]


def test_invalid_action_costs_a_turn_and_changes_nothing():
    env, obs0, _ = corridor_env()
    obs, reward, terminated, truncated, info = env.step("move right please")
    assert obs["text"] == invalid_action_feedback("visgym")
    assert "Expected one of: ('move', 0)" in obs["text"]
    assert info["invalid_action"] and info["action"] is None and info["turn"] == 1
    assert info["agent"] == (3, 1) and (reward, terminated, truncated) == (0.0, False, False)
    assert np.array_equal(obs["image"], obs0["image"])


def test_stop_off_target_terminates_without_reward():
    env, _, _ = corridor_env()
    _, reward, terminated, truncated, info = env.step(STOP)
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["success"] is False


def test_oracle_stop_on_target_rewards_one():
    env, _, _ = corridor_env(max_turns=7)
    assert env.unwrapped.solve() == CORRIDOR_SOLUTION
    assert env.unwrapped.best_action() == UP
    for action in CORRIDOR_SOLUTION:
        obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (1.0, True, False)  # stop on the last turn
    assert info["success"] is True and info["turn"] == 7 and info["shortest_path"] == 0
    assert obs["text"] == "Stopped on the target."


def test_on_target_without_stop_is_not_success():
    env, _, _ = corridor_env()
    for action in CORRIDOR_SOLUTION[:-1]:
        _, reward, terminated, _, info = env.step(action)
    assert info["agent"] == info["target"] and reward == 0.0 and not terminated
    assert not info["success"] and env.unwrapped.solve() == [STOP]


def test_truncates_at_max_turns():
    env, _, _ = corridor_env(max_turns=3)
    for turn in (1, 2, 3):
        obs, reward, terminated, truncated, info = env.step(DOWN)  # (4, 1) is the outer wall
        assert info["turn"] == turn and not terminated and truncated == (turn == 3)
    assert obs["text"] == f"{WALL_FEEDBACK} {OUT_OF_TURNS_FEEDBACK}"


def test_tagged_format():
    env, obs, _ = corridor_env(action_format="tagged")
    assert env.unwrapped.action_strings == (
        "<action>right</action>",
        "<action>up</action>",
        "<action>left</action>",
        "<action>down</action>",
        "<action>stop</action>",
    )
    assert "<action>up</action> = move up" in obs["text"]
    _, _, _, _, info = env.step("<action>up</action>")
    assert info["agent"] == (2, 1) and info["action"] == "<action>up</action>"
    _, _, _, _, info = env.step(UP)  # visgym string is not a tagged action
    assert info["invalid_action"]
    assert env.unwrapped.solve()[-1] == "<action>stop</action>"


@pytest.mark.parametrize(
    "action", ["", "\x00\xff\ud800" * 1000, "x" * 1_000_000, None, b"('move', 0)", 7]
)
def test_any_action_gets_feedback(action):
    env, _, _ = corridor_env()
    obs, _, _, _, info = env.step(action)
    assert info["invalid_action"] and obs["text"].startswith("Invalid action.")


def test_megabyte_reply_with_action_at_the_end():
    env, _, _ = corridor_env()
    _, _, _, _, info = env.step("think " * 200_000 + UP)
    assert info["agent"] == (2, 1)


def test_seeded_determinism_and_seed_sensitivity():
    actions = [RIGHT, "nonsense", UP, LEFT, DOWN, DOWN, RIGHT, UP, STOP]

    def rollout(seed):
        env = gym.make("rlfw/Maze2D-v0")
        out = [env.reset(seed=seed)]
        out += [env.step(a) for a in actions]
        return out

    a, b = rollout(3), rollout(3)
    for step_a, step_b in zip(a, b):
        assert data_equivalence(step_a, step_b, exact=True)
    layouts = set()
    env = gym.make("rlfw/Maze2D-v0").unwrapped
    for seed in range(8):
        env.reset(seed=seed)
        layouts.add(tuple(env.layout()["grid"]))
    assert len(layouts) > 1


def is_perfect(grid: list[str]) -> bool:
    """Open squares form a tree: connected, and #edges == #open squares - 1."""
    open_ = {(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "."}
    edges = sum(((r + 1, c) in open_) + ((r, c + 1) in open_) for r, c in open_)
    seen, stack = set(), [next(iter(open_))]
    while stack:
        r, c = stack.pop()
        if (r, c) in seen:
            continue
        seen.add((r, c))
        stack += [p for p in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)) if p in open_]
    return seen == open_ and edges == len(open_) - 1


def test_is_perfect_on_hand_built_grids():
    assert is_perfect(CORRIDOR["grid"])
    assert not is_perfect(["#####", "#...#", "#...#", "#...#", "#####"])  # has a cycle


@pytest.mark.parametrize("kwargs", [{}, {"difficulty": "hard"}, {"size": 5}, {"size": 13}])
def test_generated_mazes_are_perfect_with_opposite_corners(kwargs):
    env = Maze2DEnv(**kwargs)
    n = env.size
    corners = {(1, 1), (1, n - 2), (n - 2, 1), (n - 2, n - 2)}
    pairs = set()
    for seed in range(12):
        _, info = env.reset(seed=seed)
        grid = env.layout()["grid"]
        assert len(grid) == n and all(len(row) == n for row in grid)
        assert grid[0] == grid[-1] == "#" * n and all(row[0] == row[-1] == "#" for row in grid)
        assert all(grid[r][c] == "." for r in range(1, n, 2) for c in range(1, n, 2))
        assert is_perfect(grid)
        agent, target = info["agent"], info["target"]
        assert agent in corners and target == (n - 1 - agent[0], n - 1 - agent[1])
        pairs.add(agent)
    assert len(pairs) > 1


def test_size_overrides_difficulty():
    assert Maze2DEnv(difficulty="hard", size=7).size == 7
    assert Maze2DEnv(difficulty="hard").observation_space["image"].shape == (275, 275, 3)
    assert Maze2DEnv(cell_px=8).observation_space["image"].shape == (72, 72, 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 10}, "odd int >= 5"),
        ({"size": 3}, "odd int >= 5"),
        ({"difficulty": "medium"}, "valid values: easy, hard"),
        ({"max_turns": 0}, "max_turns must be an int >= 1"),
        ({"action_format": "json"}, "valid values: visgym, tagged"),
        ({"cell_px": 0}, "cell_px must be an int >= 1"),
        ({"render_mode": "ansi"}, "valid values: None, rgb_array"),
    ],
)
@pytest.mark.filterwarnings("ignore:.*render_mode.*:UserWarning")
def test_bad_kwargs_fail_at_make(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make("rlfw/Maze2D-v0", **kwargs)


def test_human_render_mode_rejected_by_the_class():
    # gymnasium.make turns render_mode="human" into rgb_array + its HumanRendering wrapper.
    with pytest.raises(ValueError, match="rgb_array"):
        Maze2DEnv(render_mode="human")


def _layout(**changes):
    layout = copy.deepcopy(CORRIDOR)
    layout.update(changes)
    return layout


@pytest.mark.parametrize(
    "layout, message",
    [
        (_layout(grid=["#####", "#...#", "#.#.", "#.#.#", "#####"]), "not rectangular"),
        (_layout(agent=[2, 2]), "agent \\[2, 2\\] is on a wall"),
        (_layout(grid=["#####", "#.x.#", "#.#.#", "#.#.#", "#####"]), "unknown character 'x'"),
        (_layout(target=[9, 9]), "outside the 5x5 grid"),
        (_layout(agent="31"), "two ints"),
        (_layout(grid=["#####", "#.#.#", "#.#.#", "#.#.#", "#####"]), "cannot be reached"),
        (_layout(grid=["#######"] + ["#.....#"] * 5 + ["#######"]), "is 7x7 but this env is 5x5"),
        ({"grid": CORRIDOR["grid"], "agent": [3, 1]}, "missing key"),
        ("#####", "must be a dict"),
    ],
)
def test_bad_layout_raises(layout, message):
    env = gym.make("rlfw/Maze2D-v0", size=5)
    with pytest.raises(ValueError, match=message):
        env.reset(options={"layout": layout})


def test_layout_extra_keys_ignored_and_roundtrip():
    env, _, _ = corridor_env()
    record = env.unwrapped.layout()
    assert record == {**CORRIDOR, "shortest_moves": 6}
    _, info = env.reset(options={"layout": {**record, "seed": 5, "note": "x"}})
    assert info["agent"] == (3, 1)


def test_a_layout_on_the_loaded_maze_plays_as_on_a_fresh_env():
    """reset(layout) on the maze already loaded keeps its BFS distances and background (they depend
    on walls and target alone): every third square, a target moved on the same walls, and another
    maze with the same target play exactly as on a fresh env."""
    env = gym.make("rlfw/Maze2D-v0", difficulty="easy")
    env.reset(seed=10**6 + 3)
    record = env.unwrapped.layout()
    squares = [[r, c] for r, row in enumerate(record["grid"]) for c, ch in enumerate(row) if ch == "."]
    moved_target = {**record, "target": squares[0], "agent": squares[-1]}
    probe = gym.make("rlfw/Maze2D-v0", difficulty="easy").unwrapped

    def layout_of(seed: int) -> dict:
        probe.reset(seed=seed)
        return probe.layout()

    other_walls = next(o for o in map(layout_of, range(10**6 + 4, 10**6 + 204))
                       if o["target"] == record["target"] and o["grid"] != record["grid"])
    for layout in [{**record, "agent": sq} for sq in squares[::3]] + [moved_target, record, other_walls, record]:
        fresh = gym.make("rlfw/Maze2D-v0", difficulty="easy")
        for e in (env, fresh):
            e.reset(options={"layout": layout})
        for action in [RIGHT, UP, LEFT, DOWN, STOP]:
            assert env.unwrapped.layout() == fresh.unwrapped.layout()
            assert env.unwrapped.best_action() == fresh.unwrapped.best_action()
            assert data_equivalence(env.step(action), fresh.step(action))
