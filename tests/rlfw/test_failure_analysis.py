"""scripts/failure_analysis.py counts wrong moves against the oracle and says how failures end."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("failure_analysis", ROOT / "scripts" / "failure_analysis.py")
fa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fa)


def _episodes(env, tasks) -> list[dict]:
    """Maze 0 solved by the oracle; maze 1 with a wrong first move, then back and forth until out of turns."""
    env.reset(options={"layout": tasks[0].layout})
    solved = env.solve()
    env.reset(options={"layout": tasks[1].layout})
    best = env.best_action()
    wrong = next(a for a in env.action_strings[:4] if a != best and not env.step(a)[-1]["wall_bump"])
    back = env.action_strings[(env.action_strings.index(wrong) + 2) % 4]
    looping = [wrong, back] * 10
    return [{"index": 0, "success": True, "actions": solved}, {"index": 1, "success": False, "actions": looping}]


def test_oracle_episode_has_no_wrong_move_and_a_loop_is_called_a_loop(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlfw.build import eval_tasks, make_env_fn
    from rlfw.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=["env=maze", f"trainer.output_dir={tmp_path}"]))
    env, (tasks, _) = make_env_fn(cfg.env)().unwrapped, eval_tasks(cfg.env)
    episodes = _episodes(env, tasks)
    result = fa.analyse(env, tasks, episodes)
    assert result["solved"] == 1 and result["with_error"] == 1 and result["recovered"] == 0
    assert result["failures"] == {"looping": 1}
    wrong = sum(w for w, _ in result["error_rate"].values())
    assert wrong == 1  # only maze 1's first move; the oracle run makes none
    assert result["error_rate"]["on_target"] == (0, 1)  # the oracle stops on the target

    # the command line: a run folder as rlfw.run leaves it
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- env=maze\n- hydra.run.dir=somewhere\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    config_name: config\n")
    folder = run / "eval" / "step_000000" / "maze"
    folder.mkdir(parents=True)
    folder.joinpath("episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    proc = subprocess.run([sys.executable, "scripts/failure_analysis.py", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 0 maze: pass@1 1/2 = 0.500" in proc.stdout
    assert "of which solved anyway: 0" in proc.stdout and "'looping': 1" in proc.stdout
