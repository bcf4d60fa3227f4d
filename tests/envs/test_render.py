"""Pixel checks of the grid renderer on the hand-built corridor maze."""

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401
from envs.render import BLUE, GRAY, RED, WHITE
from tests.envs.helpers import CORRIDOR


def square(img, row, col, px):
    return img[row * px : (row + 1) * px, col * px : (col + 1) * px]


def all_colour(pixels, rgb):
    return bool((pixels.reshape(-1, 3) == rgb).all())


def make(px, layout=CORRIDOR):
    env = gym.make("rlfw/Maze2D-v0", size=5, cell_px=px, render_mode="rgb_array")
    obs, _ = env.reset(options={"layout": layout})
    return env, obs


@pytest.mark.parametrize("px", [25, 8, 4])
def test_walls_paths_target_agent(px):
    env, obs = make(px)
    img = obs["image"]
    assert img.shape == (5 * px, 5 * px, 3) and img.dtype == np.uint8
    assert np.array_equal(env.render(), img)
    for r, row in enumerate(CORRIDOR["grid"]):
        for c, ch in enumerate(row):
            if (r, c) == (3, 1):
                continue
            expected = RED if (r, c) == (3, 3) else GRAY if ch == "#" else WHITE
            assert all_colour(square(img, r, c, px), expected), (r, c)
    agent = square(img, 3, 1, px)
    middle = agent[px // 2 - 1 : px // 2 + 1, px // 2 - 1 : px // 2 + 1]
    assert all_colour(middle, BLUE)  # the disc covers the centre at every size
    for corner in (agent[0, 0], agent[0, -1], agent[-1, 0], agent[-1, -1]):
        assert tuple(corner) == WHITE


def test_agent_disc_size_at_25px():
    _, obs = make(25)
    agent = square(obs["image"], 3, 1, 25)
    blue = (agent == BLUE).all(axis=-1)
    assert 100 <= blue.sum() <= 140  # about pi * (25 / 4) ** 2 = 123 pixels
    assert blue[12, 12] and blue[12, 6] and not blue[12, 4] and not blue[2, 12]


@pytest.mark.parametrize("px", [25, 8])
def test_agent_on_target_keeps_red_corners_and_target_survives_leaving(px):
    env, obs = make(px, {**CORRIDOR, "agent": [1, 3]})
    env.step("('move', 3)")
    obs, *_ = env.step("('move', 3)")  # onto the target
    target = square(obs["image"], 3, 3, px)
    assert tuple(target[px // 2, px // 2]) == BLUE and tuple(target[0, 0]) == RED
    obs, *_ = env.step("('move', 1)")  # off again: the target is still drawn
    assert all_colour(square(obs["image"], 3, 3, px), RED)
    assert all_colour(square(obs["image"], 1, 3, px), WHITE)  # no stale agent


def test_observations_are_fresh_arrays():
    env, obs = make(8)
    obs2, *_ = env.step("('move', 1)")
    assert not np.shares_memory(obs["image"], obs2["image"])


def test_render_none_without_render_mode():
    env = gym.make("rlfw/Maze2D-v0").unwrapped
    env.reset(seed=0)
    assert env.render() is None
