"""rlfw/MazeStep-v0: one step from a random open square, reward 1 for a shortest-path move."""

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env, data_equivalence

import envs  # noqa: F401
from envs.actions import ACTION_STRINGS, WALL_FEEDBACK
from envs.maze2d import Maze2DEnv
from tests.envs.helpers import CORRIDOR

RIGHT, UP, LEFT, DOWN, STOP = ACTION_STRINGS["visgym"]


def corridor_env(agent=(3, 1)):
    env = gym.make("rlfw/MazeStep-v0", size=5, cell_px=8)
    obs, info = env.reset(options={"layout": {**CORRIDOR, "agent": list(agent)}})
    return env, obs, info


def test_best_move_scores_one_and_terminates():
    env, obs, info = corridor_env()
    assert obs["text"] == Maze2DEnv(size=5).prompt()  # Maze2D's own task text
    assert info["best_actions"] == [UP]
    obs, reward, terminated, truncated, info = env.step(f"I go {UP}")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["agent"] == (2, 1) and obs["text"] == "Moved up."


def test_wrong_invalid_and_stop_score_zero():
    for action, feedback in [(RIGHT, WALL_FEEDBACK), (DOWN, WALL_FEEDBACK), ("go north", "Invalid action"),
                             (STOP, "Stopped, but not on the target.")]:
        env, _, _ = corridor_env()
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False), action
        assert obs["text"].startswith(feedback)


def test_every_shortest_path_move_counts():
    open_grid = {"grid": ["#####", "#...#", "#...#", "#...#", "#####"], "agent": [3, 1], "target": [1, 3]}
    env = gym.make("rlfw/MazeStep-v0", size=5)
    _, info = env.reset(options={"layout": open_grid})
    assert sorted(info["best_actions"]) == sorted([RIGHT, UP])
    for action, want in [(RIGHT, 1.0), (UP, 1.0), (LEFT, 0.0), (DOWN, 0.0)]:
        env.reset(options={"layout": open_grid})
        assert env.unwrapped.check(action) == want and env.step(action)[1] == want


def test_stop_on_target_scores_one():
    env, _, info = corridor_env(agent=(3, 3))
    assert info["best_actions"] == [STOP]
    assert env.step(STOP)[1:3] == (1.0, True)


def test_reset_seed_puts_agent_on_a_random_open_square():
    env = gym.make("rlfw/MazeStep-v0").unwrapped
    agents, seen_mazes = set(), set()
    for seed in range(40):
        env.reset(seed=seed)
        record = env.layout()
        r, c = record["agent"]
        assert record["grid"][r][c] == "." and record["agent"] != record["target"]
        assert record["shortest_moves"] >= 1
        agents.add((r, c))
        seen_mazes.add(tuple(record["grid"]))
        maze = gym.make("rlfw/Maze2D-v0").unwrapped
        maze.reset(seed=seed)
        assert maze.layout()["grid"] == record["grid"] and maze.layout()["target"] == record["target"]
    assert len(agents) > 10 and len(seen_mazes) > 30


def test_seeded_reset_and_step_are_deterministic():
    def run():
        env = gym.make("rlfw/MazeStep-v0", cell_px=8)
        out = []
        for seed in (3, 4, 3):
            obs, info = env.reset(seed=seed)
            out += [obs, info, env.step(env.unwrapped.best_action())]
        return out

    a, b = run(), run()
    assert data_equivalence(a, b, exact=True)
    assert np.array_equal(a[0]["image"], a[6]["image"]) and a[1] == a[7]  # same seed, same state


def test_check_env():
    check_env(gym.make("rlfw/MazeStep-v0").unwrapped)
    check_env(gym.make("rlfw/MazeStep-v0", render_mode="rgb_array", action_format="tagged").unwrapped)
