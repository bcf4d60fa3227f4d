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


def _config(run: Path, *overrides: str):
    """The typed rlfw.run config that today's conf/ composes with `overrides`, writing into `run`."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlfw.config import register_configs, repo_root

    register_configs()
    with initialize_config_dir(config_dir=repo_root() + "/conf", version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=[*overrides, f"trainer.output_dir={run}"]))


def _run_folder(run: Path, cfg, episodes: list[dict]) -> Path:
    """A run folder as rlfw.run leaves it: the saved config, and step 0's episodes on the env's eval set."""
    from rlfw.config_io import save_run_config

    folder = run / "eval" / "step_000000" / "maze"
    folder.mkdir(parents=True)
    folder.joinpath("episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    save_run_config(cfg, run)
    return run


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
    from rlfw.build import eval_tasks, make_env_fn

    run = tmp_path / "run"
    cfg = _config(run, "env=maze")
    env, (tasks, _) = make_env_fn(cfg.env)().unwrapped, eval_tasks(cfg.env)
    episodes = _episodes(env, tasks)
    result = fa.analyse(env, tasks, episodes)
    assert result["solved"] == 1 and result["with_error"] == 1 and result["recovered"] == 0
    assert result["failures"] == {"looping": 1}
    wrong = sum(w for w, _ in result["error_rate"].values())
    assert wrong == 1  # only maze 1's first move; the oracle run makes none
    assert result["error_rate"]["on_target"] == (0, 1)  # the oracle stops on the target

    # the command line: a run folder as rlfw.run leaves it (its config.yaml, no .hydra/)
    _run_folder(run, cfg, episodes)
    proc = subprocess.run([sys.executable, "scripts/failure_analysis.py", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 0 maze: pass@1 1/2 = 0.500" in proc.stdout
    assert "of which solved anyway: 0" in proc.stdout and "'looping': 1" in proc.stdout


def test_the_run_s_saved_config_is_used_not_today_s_conf(tmp_path, monkeypatch, capsys):
    """A run started with settings today's conf/ does not give (tagged actions, 30 turns) is replayed
    under those settings, even where a .hydra/ folder would recompose to today's env=maze preset."""
    from rlfw.build import eval_tasks, make_env_fn

    run = tmp_path / "run"
    cfg = _config(run, "env=maze", "env.action_format=tagged", "env.max_turns=30")
    today = _config(run, "env=maze").env
    assert (today.action_format, today.max_turns) == ("visgym", 20)  # the saved settings are not the preset's
    env, (tasks, _) = make_env_fn(cfg.env)().unwrapped, eval_tasks(cfg.env)
    episodes = _episodes(env, tasks)
    assert episodes[0]["actions"][-1] == "<action>stop</action>"  # recorded in the run's own action format
    _run_folder(run, cfg, episodes)
    (run / ".hydra").mkdir()  # what recomposing from today's conf/ would give: the visgym preset
    (run / ".hydra" / "overrides.yaml").write_text("- env=maze\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    config_name: config\n")

    built = []
    monkeypatch.setattr(fa, "make_env_fn", lambda env_cfg: built.append(env_cfg) or make_env_fn(env_cfg))
    monkeypatch.setattr(sys, "argv", ["failure_analysis.py", str(run)])
    fa.main()
    assert built == [cfg.env]  # the saved env config, field for field
    out = capsys.readouterr().out
    assert "step 0 maze: pass@1 1/2 = 0.500" in out
    # replayed as tagged actions, only maze 1's first move is wrong (as visgym, every move would be)
    assert "episodes with a wrong move: 1, of which solved anyway: 0" in out
    assert "'looping': 1" in out


def test_an_rlfw_eval_folder_is_replayed_on_the_mazes_it_played(tmp_path, monkeypatch, capsys):
    """An rlfw.eval folder (config.yaml, <set>/episodes.jsonl): each set is replayed on the mazes that
    set played (the oracle's moves of one set are wrong moves on another's); --steps and sampled
    evaluations (eval.n > 1) are refused."""
    import pytest
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from envs.layout import open_moves, parse_layout
    from rlfw.build import eval_tasks, make_env_fn
    from rlfw.config import register_configs, repo_root
    from rlfw.config_io import save_run_config

    def eval_config(out, *overrides):
        register_configs()
        with initialize_config_dir(config_dir=repo_root() + "/conf", version_base="1.3"):
            return OmegaConf.to_object(compose("eval", overrides=[f"eval.output_dir={out}", *overrides]))

    out = tmp_path / "eval_out"
    cfg = eval_config(out, "eval.sets=[eval64,heldout]", "eval.heldout_size=16")
    env = make_env_fn(cfg.env)().unwrapped
    expected = {}
    for name in ("eval64", "heldout"):
        tasks, _ = eval_tasks(cfg.env, name, 16)
        # the mazes up to the first whose start has a wrong open move: that one looping, the others solved
        # by the oracle; each set's episodes replay without a wrong move only on that set's mazes
        loop = next(i for i, t in enumerate(tasks) if len(open_moves(*parse_layout(t.layout)[:2])) >= 2)
        episodes = []
        for i, task in enumerate(tasks[:loop + 1]):
            if i == loop:
                episodes.append({**_episodes(env, [task, task])[1], "index": i})
            else:
                env.reset(options={"layout": task.layout})
                episodes.append({"index": i, "success": True, "actions": env.solve()})
        (out / name).mkdir(parents=True)
        (out / name / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
        expected[name] = f"eval {name}: pass@1 {loop}/{loop + 1} = {loop / (loop + 1):.3f}"
    save_run_config(cfg, out)
    monkeypatch.setattr(sys, "argv", ["failure_analysis.py", str(out)])
    fa.main()
    text = capsys.readouterr().out
    assert all(line in text for line in expected.values()), text
    assert text.count("episodes with a wrong move: 1, of which solved anyway: 0") == 2
    assert text.count("'looping': 1") == 2

    monkeypatch.setattr(sys, "argv", ["failure_analysis.py", str(out), "--steps", "0"])
    with pytest.raises(SystemExit):
        fa.main()
    assert "holds one evaluation" in capsys.readouterr().err
    sampled = tmp_path / "sampled"
    sampled.mkdir()
    save_run_config(eval_config(sampled, "eval.n=4", "eval.temperature=1.0"), sampled)
    monkeypatch.setattr(sys, "argv", ["failure_analysis.py", str(sampled)])
    with pytest.raises(SystemExit, match="eval.n=4"):
        fa.main()


def test_a_run_without_a_saved_config_is_refused_by_name(tmp_path, monkeypatch):
    """A run folder from before config.yaml existed: the message names the file, with no .hydra/ fallback."""
    import pytest

    run = tmp_path / "old_run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- env=maze\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    config_name: config\n")
    monkeypatch.setattr(sys, "argv", ["failure_analysis.py", str(run)])
    with pytest.raises(SystemExit, match="predates") as exc:
        fa.main()
    assert str(run / "config.yaml") in str(exc.value)


def test_move_prob_scores_the_turn_the_policy_saw():
    """Replaying the shipped checkpoint's own greedy episodes, the move it played is, at every turn,
    the one `move_prob` scores highest: the scored prompt is the rollout's prompt."""
    from rlfw.build import build_policy_model, eval_tasks, make_env_fn
    from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig
    from rlfw.evaluate import evaluate
    from rlfw.rollout.agent_loop import LoopLimits
    from rlfw.rollout.engine import TransformersEngine

    ckpt = ROOT / "checkpoints" / "tiny_vl_maze_sft"
    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", eval_set="eval64", max_turns=20)
    model, processor = build_policy_model(ModelConfig(name="tiny_vl", path=str(ckpt), lora=LoraConfig(rank=0)),
                                          str(ckpt))
    tasks, layouts = eval_tasks(env_cfg)
    tasks, layouts = tasks[:6], layouts[:6]
    make_env = make_env_fn(env_cfg, processor.crop_px)
    _, played = evaluate(TransformersEngine(model, processor), processor, [make_env() for _ in tasks], tasks, layouts,
                         LoopLimits(max_turns=20, max_new_tokens=env_cfg.max_new_tokens, max_episode_tokens=4096),
                         "eval64")
    model.eval()
    env = make_env().unwrapped  # the bare env, as the script uses it: move_prob cuts the policy's border
    turns = 0
    for task, ep in zip(tasks, played):
        obs, _ = env.reset(options={"layout": task.layout})
        task_text, feedback = obs["text"], ""
        for action in ep.actions:
            probs = [fa.move_prob(model, processor, obs, task_text, feedback, a) for a in env.action_strings]
            assert env.action_strings[max(range(len(probs)), key=probs.__getitem__)] == action
            assert 0.0 < sum(probs) <= 1.0 + 1e-5
            obs = env.step(action)[0]
            feedback = obs["text"]
            turns += 1
    assert turns >= 30

    # the analysis scores the oracle's move once per episode that went wrong, below the move played
    episodes = [{"index": i, "success": e.success, "actions": e.actions} for i, e in enumerate(played)]
    result = fa.analyse(env, tasks, episodes, policy=(model, processor))
    scored = [p for probs in result["oracle_prob"].values() for p in probs]
    assert len(scored) == result["with_error"] > 0
    assert all(0.0 < p <= 0.5 for p in scored)  # no more than the move played, so at most one half


def test_policy_folders_load_as_the_trainer_wrote_them(tmp_path):
    """A lora_sync adapter (on the run's model.path) and a full-weights folder without processor
    files both score a turn exactly as the model that wrote them."""
    import torch

    from rlfw.build import build_policy_model, eval_tasks, make_env_fn
    from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig
    from rlfw.models.weights import save_policy_weights

    ckpt = ROOT / "checkpoints" / "tiny_vl_maze_sft"
    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", eval_set="eval64", max_turns=20)
    env = make_env_fn(env_cfg)().unwrapped
    obs, _ = env.reset(options={"layout": eval_tasks(env_cfg)[0][0].layout})
    for rank in (4, 0):
        model, processor = build_policy_model(ModelConfig(name="tiny_vl", path=str(ckpt),
                                                          lora=LoraConfig(rank=rank, alpha=8)), str(ckpt))
        with torch.no_grad():  # move the weights away from the checkpoint's, so loading them matters
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        model.eval()
        folder = save_policy_weights(model, tmp_path / f"sync_r{rank}", 7)
        loaded, loaded_processor = fa.load_policy_for_scoring(folder, str(ckpt))
        loaded.eval()
        for action in env.action_strings:
            want = fa.move_prob(model, processor, obs, obs["text"], "", action)
            got = fa.move_prob(loaded, loaded_processor, obs, obs["text"], "", action)
            assert abs(want - got) < 1e-5, (rank, action, want, got)


def test_a_moved_base_model_is_refused_by_name_before_loading(tmp_path):
    """An adapter whose run's model.path no longer exists: the message names the path and --base,
    rather than a hub error about a repo id."""
    import pytest

    adapter = tmp_path / "lora_sync" / "v220"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    gone = str(tmp_path / "worktree" / "checkpoints" / "tiny_vl_maze_sft")
    with pytest.raises(SystemExit, match="--base") as exc:
        fa.load_policy_for_scoring(adapter, gone)
    assert gone in str(exc.value)
