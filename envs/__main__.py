"""List the registered ``rlfw/`` environments: ``python -m envs [--module mypkg.myenvs ...]``.

Each ``--module`` is imported first (as ``env.module`` in the config is), so that environments it
registers are listed too.
"""

from __future__ import annotations

import argparse
import sys

import gymnasium as gym

from envs.registry import import_env_module, list_envs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--module", action="append", default=[], help="module to import first (repeatable)"
    )
    args = parser.parse_args(argv)
    for name in args.module:
        try:
            import_env_module(name)
        except (ImportError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print("| id | entry point | kwargs |")
    print("|---|---|---|")
    for env_id in list_envs():
        spec = gym.spec(env_id)
        entry = spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point)
        print(f"| {env_id} | {entry} | {spec.kwargs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
