"""rlfw/GridGoal-v0: generation, a hand-built layout, bad kwargs."""

import gymnasium as gym
import pytest

import envs  # noqa: F401
from envs.grid_goal import GridGoalEnv
from envs.render import GREEN

OPEN = {"grid": ["....", ".#..", "....", "...."], "agent": [1, 0], "target": [1, 2]}


def test_generated_layouts_are_solvable_with_the_right_obstacle_count():
    env = GridGoalEnv(size=6, obstacles=9)
    for seed in range(20):
        _, info = env.reset(seed=seed)
        layout = env.layout()
        assert sum(row.count("#") for row in layout["grid"]) == 9
        assert info["agent"] != info["target"] and info["shortest_path"] > 0
        assert len(env.solve()) == info["shortest_path"] + 1


def test_hand_built_layout_moves_and_oracle():
    env = gym.make("rlfw/GridGoal-v0", size=4, cell_px=8)
    obs, info = env.reset(options={"layout": OPEN})
    assert info["shortest_path"] == 4  # around the obstacle at (1, 1)
    assert env.unwrapped.solve() == [
        "('move', 1)",
        "('move', 0)",
        "('move', 0)",
        "('move', 3)",
        "('stop', 'stop')",
    ]
    target = obs["image"][8:16, 16:24]
    assert (target.reshape(-1, 3) == GREEN).all()
    _, _, _, _, info = env.step("('move', 2)")  # off the grid's left edge
    assert info["wall_bump"] and info["agent"] == (1, 0)
    _, _, _, _, info = env.step("('move', 0)")  # into the obstacle
    assert info["wall_bump"]
    assert "green square" in env.unwrapped.prompt()


def test_images_scale_with_cell_px():
    assert GridGoalEnv(size=5, cell_px=4).observation_space["image"].shape == (20, 20, 3)
    env = GridGoalEnv(size=3, obstacles=0)
    obs, _ = env.reset(seed=1)
    assert obs["image"].shape == (75, 75, 3) and not (obs["image"] == (169, 169, 169)).all(-1).any()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 2}, "size must be an int >= 3"),
        ({"obstacles": 7}, r"obstacles must be an int in \[0, 6\]"),
        ({"obstacles": -1}, r"\[0, 6\]"),
        ({"action_format": "xml"}, "valid values: visgym, tagged"),
        ({"max_turns": 0}, ">= 1"),
    ],
)
def test_bad_kwargs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make("rlfw/GridGoal-v0", **kwargs)
