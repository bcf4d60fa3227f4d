"""Every registered rlfw/ env: gymnasium's check_env, a seeded determinism rollout, the contract."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

import envs

ENV_IDS = envs.list_envs()


def test_builtins_registered():
    assert {"rlfw/Maze2D-v0", "rlfw/GridGoal-v0"} <= set(ENV_IDS)


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("kwargs", [{}, {"render_mode": "rgb_array", "action_format": "tagged"}])
def test_check_env(env_id, kwargs):
    # On the unwrapped env, as check_env asks; with a spec, so render modes are checked too.
    check_env(gym.make(env_id, **kwargs).unwrapped)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_seeded_rollout_is_deterministic(env_id):
    def rollout():
        env = gym.make(env_id)
        env.action_space.seed(7)
        out = [env.reset(seed=11)]
        strings = env.unwrapped.action_strings
        for i in range(12):
            action = strings[i % 4] if i % 3 else env.action_space.sample()
            out.append(env.step(action))
        out.append(env.reset(seed=12))
        return out

    assert data_equivalence(rollout(), rollout(), exact=True)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_contract(env_id):
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    assert set(obs) == {"image", "text"} and obs in env.observation_space
    assert obs["image"].dtype == np.uint8 and obs["image"].ndim == 3 and obs["image"].shape[2] == 3
    assert obs["text"] == env.unwrapped.prompt()
    assert info["success"] is False
    assert len(env.unwrapped.action_strings) == 5
    solution = env.unwrapped.solve()
    assert env.unwrapped.best_action() == solution[0]
    for action in solution:
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs in env.observation_space and isinstance(obs["text"], str)
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
