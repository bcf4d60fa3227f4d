"""rlfw environments: Gymnasium 1.x environments for multi-turn VLM post-training.

Importing `envs` registers the built-ins under the ``rlfw/`` namespace:

- ``rlfw/Maze2D-v0`` (`envs.maze2d.Maze2DEnv`): VisGym's ``maze_2d``, easy 9x9 or hard 11x11.
- ``rlfw/GridGoal-v0`` (`envs.grid_goal.GridGoalEnv`): walk onto a green square in an open grid.
- ``rlfw/MazeStep-v0`` (`envs.maze_step.MazeStepEnv`): one step of a maze from a random open square;
  reward 1.0 for a move on a shortest path (single-turn; used by ``scripts/bench_trl.py``).

``python -m envs [--module mypkg.myenvs]`` lists the registered ``rlfw/`` environments.

The contract every rlfw environment meets (the rollout code relies on nothing else):

- ids look like ``rlfw/Name-vN`` and are registered with `envs.register`;
- the observation is a dict ``{"image": uint8 array H x W x 3, "text": str}``;
- the action is a str: the model's whole reply; the env finds the action in it and never raises
  on any str;
- the text returned by ``reset`` is the task prompt, the text returned by ``step`` is short
  feedback on that step;
- ``info["success"]`` is a bool (True once the task is solved);
- optionally ``env.unwrapped.solve()`` returns oracle action strings from the current state.

The built-ins also expose ``best_action()``, ``action_strings`` (the canonical actions),
``prompt()`` and ``layout()``, and ``reset(options={"layout": record})`` to replay a saved layout
(see `envs.eval_sets`). Optionally ``state_tag()`` names the kind of state the agent is in, one of
the env's ``state_tags`` (the built-ins: junction or corridor), for levers that weigh states by it.
"""

from envs.actions import ACTION_FORMATS, ACTION_STRINGS, parse_action
from envs.grid_goal import GridGoalEnv
from envs.maze2d import Maze2DEnv
from envs.maze_step import MazeStepEnv
from envs.registry import NAMESPACE, import_env_module, list_envs, register

register("rlfw/Maze2D-v0", "envs.maze2d:Maze2DEnv")
register("rlfw/GridGoal-v0", "envs.grid_goal:GridGoalEnv")
register("rlfw/MazeStep-v0", "envs.maze_step:MazeStepEnv")

__all__ = [
    "ACTION_FORMATS",
    "ACTION_STRINGS",
    "NAMESPACE",
    "GridGoalEnv",
    "Maze2DEnv",
    "MazeStepEnv",
    "import_env_module",
    "list_envs",
    "parse_action",
    "register",
]
