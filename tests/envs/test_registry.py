"""Registry: id rules, a user env registered from its own module, `python -m envs`."""

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

import envs

ROOT = Path(__file__).resolve().parents[2]
USER_MODULE = "rlfw_test_user_envs"
USER_SOURCE = textwrap.dedent(
    """
    import envs
    from envs.grid_goal import GridGoalEnv


    class WideGoalEnv(GridGoalEnv):
        pass


    envs.register("rlfw/TestWideGoal-v0", "rlfw_test_user_envs:WideGoalEnv", size=8, obstacles=0)
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(USER_MODULE, None)
    gym.registry.pop("rlfw/TestWideGoal-v0", None)


def test_user_env_from_its_own_module(user_module):
    assert "rlfw/TestWideGoal-v0" not in envs.list_envs()
    module = envs.import_env_module(USER_MODULE)
    assert module.__name__ == USER_MODULE
    assert "rlfw/TestWideGoal-v0" in envs.list_envs()
    env = gym.make("rlfw/TestWideGoal-v0", max_turns=5)
    obs, _ = env.reset(seed=0)
    assert obs["image"].shape == (200, 200, 3) and env.unwrapped.max_turns == 5


def test_register_callable_entry_point():
    try:
        envs.register("rlfw/TestCallable-v1", lambda **kw: envs.GridGoalEnv(**kw), size=4)
        assert gym.make("rlfw/TestCallable-v1").unwrapped.size == 4
    finally:
        gym.registry.pop("rlfw/TestCallable-v1", None)


@pytest.mark.parametrize(
    "env_id",
    ["Maze2D-v0", "rlfw/Maze2D", "gym/Maze2D-v0", "rlfw/Maze 2D-v0", "rlfw/Maze2D-v01", "", None],
)
def test_bad_ids_rejected(env_id):
    with pytest.raises(ValueError, match="must look like 'rlfw/Name-vN'"):
        envs.register(env_id, "envs.maze2d:Maze2DEnv")
    assert env_id not in envs.list_envs()


@pytest.mark.parametrize("entry_point", ["envs.maze2d.Maze2DEnv", "envs maze2d:Maze2DEnv", 3])
def test_bad_entry_points_rejected(entry_point):
    with pytest.raises(ValueError, match="entry_point"):
        envs.register("rlfw/TestBad-v0", entry_point)


def test_import_env_module_errors(tmp_path, monkeypatch):
    with pytest.raises(ImportError, match="could not import env module 'no_such_pkg_xyz.envs'"):
        envs.import_env_module("no_such_pkg_xyz.envs")
    (tmp_path / "rlfw_test_broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="RuntimeError: boom"):
        envs.import_env_module("rlfw_test_broken")
    with pytest.raises(ValueError, match="dotted Python module path"):
        envs.import_env_module("not a module")


def run_cli(*args, pythonpath=()):
    env = {"PYTHONPATH": ":".join([str(ROOT), *map(str, pythonpath)]), "PATH": ""}
    return subprocess.run(
        [sys.executable, "-m", "envs", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_cli_lists_builtins():
    out = run_cli()
    assert out.returncode == 0, out.stderr
    assert "| rlfw/Maze2D-v0 | envs.maze2d:Maze2DEnv | {} |" in out.stdout
    assert "| rlfw/GridGoal-v0 | envs.grid_goal:GridGoalEnv | {} |" in out.stdout


def test_cli_lists_user_module(user_module):
    out = run_cli("--module", USER_MODULE, pythonpath=[user_module])
    assert out.returncode == 0, out.stderr
    assert "rlfw/TestWideGoal-v0 | rlfw_test_user_envs:WideGoalEnv" in out.stdout
    assert "'size': 8" in out.stdout


def test_cli_bad_module():
    out = run_cli("--module", "no_such_pkg_xyz")
    assert out.returncode == 2 and "could not import env module" in out.stderr
