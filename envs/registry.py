"""Registration of rlfw environments: a checked front to `gymnasium.register`.

Built-in environments are registered when `envs` is imported. A user adds one from their own
package by calling `envs.register` at import time of a module, and names that module in the config
(``env.module=mypkg.myenvs``); the framework calls `import_env_module` before ``gymnasium.make``::

    # mypkg/myenvs.py
    import envs
    envs.register("rlfw/MyTask-v0", "mypkg.myenvs:MyTaskEnv", size=7)
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from types import ModuleType

import gymnasium as gym

NAMESPACE = "rlfw"
ID_PATTERN = re.compile(rf"^{NAMESPACE}/[A-Za-z][A-Za-z0-9_]*-v(0|[1-9][0-9]*)$")
_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def register(id: str, entry_point: str | Callable[..., gym.Env], **kwargs) -> None:
    """Register an environment under `id` (``rlfw/Name-vN``).

    `entry_point` is ``"package.module:ClassName"`` or a callable returning a `gymnasium.Env`;
    `kwargs` are the default constructor arguments (``gymnasium.make(id, **overrides)`` can
    override them). Environments truncate on their own ``max_turns``, so no TimeLimit is added.
    """
    if not isinstance(id, str) or not ID_PATTERN.match(id):
        raise ValueError(
            f"environment id {id!r} must look like '{NAMESPACE}/Name-vN' "
            f"(e.g. '{NAMESPACE}/Maze2D-v0'): the '{NAMESPACE}/' namespace, a name of letters, "
            "digits and underscores starting with a letter, and a version"
        )
    if isinstance(entry_point, str):
        if not _ENTRY_POINT.match(entry_point):
            raise ValueError(
                f"entry_point {entry_point!r} must look like 'package.module:ClassName'"
            )
    elif not callable(entry_point):
        raise ValueError(
            f"entry_point must be a 'module:Class' string or a callable, got {entry_point!r}"
        )
    gym.register(id=id, entry_point=entry_point, kwargs=kwargs)


def list_envs() -> list[str]:
    """Sorted ids of all registered ``rlfw/`` environments."""
    return sorted(env_id for env_id in gym.registry if env_id.startswith(f"{NAMESPACE}/"))


def import_env_module(name: str) -> ModuleType:
    """Import the module `name` (e.g. ``"mypkg.myenvs"``) so that its `register` calls run.

    Raises ImportError saying which module failed and why (not installed, not on PYTHONPATH, or an
    error raised while importing it).
    """
    if not isinstance(name, str) or not _MODULE_NAME.match(name):
        raise ValueError(f"env module name must be a dotted Python module path, got {name!r}")
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise ImportError(
            f"could not import env module {name!r} ({type(exc).__name__}: {exc}); make sure its "
            "package is installed or on PYTHONPATH and that importing it does not fail"
        ) from exc
