"""The README's own-environment example works as written (so the docs cannot drift)."""

import re
import sys
from pathlib import Path

from gymnasium.utils.env_checker import check_env

ROOT = Path(__file__).resolve().parents[2]


def test_readme_user_env_example(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if b.startswith("# my_envs.py"))
    (tmp_path / "my_envs.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_envs", raising=False)

    from rlfw.build import env_corpus, make_env_fn
    from rlfw.config import EnvConfig

    make_env = make_env_fn(EnvConfig(name="custom", id="rlfw/Lights-v0", module="my_envs", max_turns=3))
    env = make_env()
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    answer = env.unwrapped.action_strings[env.unwrapped.colour]
    _, reward, terminated, _, info = env.step(f"  {answer} ")
    assert reward == 1.0 and terminated and info["success"]
    corpus, actions, px = env_corpus(make_env)
    assert actions == ["red", "blue"] and px == 16
