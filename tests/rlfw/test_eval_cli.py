"""`python -m rlfw.eval`: a model folder (or model + PEFT adapter) scores through the in-training
evaluation what its record says, writes metrics.json, episodes and GIFs, samples pass@k, and refuses
bad input before loading anything."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlfw.config import ClusterConfig, EvalRunConfig, LoraConfig, ModelConfig, register_configs, repo_root
from rlfw.validation import ConfigError, validate_eval

ROOT = Path(repo_root())
CKPT = ROOT / "checkpoints" / "tiny_vl_maze_sft"
VISGYM = ROOT / "envs" / "data" / "visgym_maze2d_seeds_0_63.json"
register_configs()


def compose_eval(out_dir: Path, *overrides: str) -> EvalRunConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("eval", overrides=[f"eval.output_dir={out_dir}", "eval.torch_threads=1", *overrides])
    return OmegaConf.to_object(cfg)


def run(out_dir: Path, *overrides: str) -> dict:
    from rlfw.eval import run_eval

    return run_eval(compose_eval(out_dir, *overrides))


def episodes(out_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out_dir / name / "episodes.jsonl").read_text().splitlines()]


def visgym(difficulty: str = "easy") -> list[dict]:
    return json.loads(VISGYM.read_text())["sets"][f"maze_2d/{difficulty}"]


@pytest.fixture(scope="module")
def few(tmp_path_factory) -> Path:
    """Six VisGym easy mazes as a layouts file (the set is named `few`)."""
    path = tmp_path_factory.mktemp("layouts") / "few.json"
    path.write_text(json.dumps(visgym()[:6]))
    return path


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, few) -> Path:
    """The shipped checkpoint, greedy, on `few`."""
    out = tmp_path_factory.mktemp("base")
    torch.set_num_threads(1)
    run(out, f"eval.layouts={few}")
    return out


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    """A rank-4 LoRA on the shipped checkpoint with random lora_B (so it changes the policy),
    published as the trainer publishes it: `<sync root>/v1/` + LATEST."""
    from rlfw.build import build_policy_model
    from rlfw.models.weights import save_policy_weights

    torch.manual_seed(0)
    lora = ModelConfig(name="tiny_vl", path=str(CKPT), lora=LoraConfig(rank=4, alpha=8))
    model, _ = build_policy_model(lora, str(CKPT))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return save_policy_weights(model, tmp_path_factory.mktemp("lora_sync"), 1)


def test_reproduces_the_shipped_checkpoint_recorded_eval64_pass_at_1(tmp_path):
    recorded = json.loads((CKPT / "rlfw_sft.json").read_text())
    record = run(tmp_path)  # the defaults: model=tiny_vl_sft (as it is, no fresh LoRA), env=maze, eval64, greedy
    assert record["eval/eval64/pass_at_1"] == recorded["eval/eval64/pass_at_1"] == 0.40625
    assert record["eval/eval64/turns_mean"] == recorded["eval/eval64/turns_mean"]
    assert record["eval/eval64/solvable_fraction"] == 1.0
    assert record["sets"] == {"eval64": {"mazes": 64, "episodes": 64}} and record["adapter"] is None
    assert len(episodes(tmp_path, "eval64")) == 64 and len(list((tmp_path / "eval64").glob("*.gif"))) == 4
    from rlfw.config_io import load_run_config

    assert isinstance(load_run_config(tmp_path), EvalRunConfig)


def test_cli_writes_metrics_episodes_gifs_and_prints_the_table(tmp_path, few):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "rlfw.eval", f"eval.layouts={few}", "eval.sets=[heldout]", "eval.heldout_size=3",
           "eval.save_gifs=2", "eval.torch_threads=1", f"eval.output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "metrics.json").read_text())
    assert record["command"].startswith("python -m rlfw.eval ") and f"eval.layouts={few}" in record["command"]
    assert record["model"] == str(CKPT) and record["sets"] == {"heldout": {"mazes": 3, "episodes": 3},
                                                              "few": {"mazes": 6, "episodes": 6}}
    for name, n in [("heldout", 3), ("few", 6)]:
        assert 0 <= record[f"eval/{name}/pass_at_1"] <= 1 and f"eval/{name}/solvable_fraction" in record
        assert len(episodes(out, name)) == n
        assert sorted(p.name for p in (out / name).glob("*.gif")) == ["episode_000.gif", "episode_001.gif"]
    assert "| set | episodes | pass@1 | solvable | mean turns | invalid-action rate |" in proc.stdout
    assert f"| few | 6 | {record['eval/few/pass_at_1']:.3f} |" in proc.stdout and "| heldout | 3 |" in proc.stdout

    cmd = [sys.executable, "-m", "rlfw.eval", "eval.sets=[eval65]", f"eval.output_dir={tmp_path / 'bad'}",
           f"hydra.run.dir={tmp_path / 'hydra_bad'}"]
    bad = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "'eval65' is not one of" in bad.stderr and not (tmp_path / "bad").exists()


def test_an_adapter_changes_the_episodes_and_plays_as_the_rollout_engine_would(tmp_path, few, base_run, adapter):
    from envs.eval_sets import load_layout_file

    from rlfw.build import make_env_fn
    from rlfw.evaluate import evaluate
    from rlfw.rollout.agent_loop import LoopLimits
    from rlfw.rollout.backends import build_engine
    from rlfw.rollout.types import Task

    record = run(tmp_path, f"eval.layouts={few}", f"eval.adapter={adapter}")
    assert record["adapter"] == str(adapter) and record["adapter_rank"] == 4
    played = episodes(tmp_path, "few")
    assert [e["actions"] for e in played] != [e["actions"] for e in episodes(base_run, "few")]

    # in training, an engine builds the LoRA-wrapped model, then loads the published adapter version
    cfg = compose_eval(tmp_path)
    engine = build_engine("transformers", ModelConfig(name="tiny_vl", path=str(CKPT), lora=LoraConfig(rank=4, alpha=8)),
                          str(CKPT), ClusterConfig(name="local"), "cpu")
    assert engine.load_weights(str(adapter.parent)) == 1
    layouts = load_layout_file(few)
    tasks = [Task(seed=int(r["seed"]), layout=r) for r in layouts]
    e = cfg.env
    metrics, in_training = evaluate(engine, engine.processor, [make_env_fn(e, engine.processor.crop_px)() for _ in tasks], tasks, layouts,
                                    LoopLimits(e.max_turns, e.max_new_tokens, e.max_episode_tokens, e.history), "few")
    assert metrics["eval/few/pass_at_1"] == record["eval/few/pass_at_1"]
    assert [ep.actions for ep in in_training] == [ep["actions"] for ep in played]


def test_sampled_n_reports_pass_at_1_and_pass_at_n(tmp_path, few, base_run):
    record = run(tmp_path, f"eval.layouts={few}", "eval.n=2", "eval.temperature=1.0", "eval.save_gifs=3")
    p1, p2 = record["eval/few/pass_at_1"], record["eval/few/pass_at_2"]
    played = episodes(tmp_path, "few")
    assert len(played) == 12 and record["sets"]["few"] == {"mazes": 6, "episodes": 12}
    successes = np.array([e["success"] for e in played]).reshape(6, 2)
    assert p1 == successes.mean() and p2 == successes.any(axis=1).mean() and p2 >= p1
    assert len(list((tmp_path / "few").glob("*.gif"))) == 3
    assert played != episodes(base_run, "few") * 2  # sampled, not the greedy episodes repeated
    # the same seed samples the same episodes
    again = run(tmp_path / "again", f"eval.layouts={few}", "eval.n=2", "eval.temperature=1.0")
    assert again["eval/few/pass_at_2"] == p2 and episodes(tmp_path / "again", "few") == played


def test_pass_at_k_is_the_unbiased_estimator():
    from rlfw.evaluate import pass_at_k

    s = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0]])  # 1, 0 and 2 successes of 3
    assert pass_at_k(s, 1) == pytest.approx((1 / 3 + 0 + 2 / 3) / 3)
    # k=2: 1 - C(3-c, 2) / C(3, 2) = 1 - 1/3, 0, 1 - 0/3
    assert pass_at_k(s, 2) == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert pass_at_k(s, 3) == pytest.approx(2 / 3)  # k = n: solved at least once
    with pytest.raises(ValueError, match="pass@4"):
        pass_at_k(s, 4)


def _bad_files(tmp: Path) -> dict[str, Path]:
    files = {"malformed.json": "{not json", "object.json": json.dumps({"sets": {}}),
             "no_target.json": json.dumps([{k: v for k, v in visgym()[0].items() if k != "target"}]),
             "hard.json": json.dumps(visgym("hard")[:2])}
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "empty_folder").mkdir()
    return {name: tmp / name for name in [*files, "empty_folder"]}


@pytest.mark.parametrize("overrides, message", [
    (["model.path=/nonexistent/model"], "model.path=/nonexistent/model: no such model folder"),
    (["model.path={tmp}/empty_folder"], "is not a model folder (no config.json)"),
    (["eval.adapter={tmp}/empty_folder"], "holds no adapter_config.json, so it is not a PEFT adapter folder"),
    ([f"eval.adapter={CKPT}"], "it is a full model folder: pass it as model.path= instead"),
    (["eval.adapter=/nonexistent/adapter"], "eval.adapter=/nonexistent/adapter: no such folder"),
    (["eval.sets=[eval65]"], "eval.sets: 'eval65' is not one of ['heldout', 'eval64', 'eval64_hard']"),
    (["eval.sets=[eval64_hard]"], "eval.sets=eval64_hard holds hard mazes; set env.difficulty=hard"),
    (["eval.sets=[]"], "nothing to evaluate"),
    (["eval.layouts=/nonexistent/mazes.json"], "layouts file /nonexistent/mazes.json does not exist"),
    (["eval.layouts={tmp}/malformed.json"], "is not readable JSON"),
    (["eval.layouts={tmp}/object.json"], "must hold a non-empty JSON list of layout records"),
    (["eval.layouts={tmp}/no_target.json"], "record 0: layout is missing key(s) ['target']"),
    (["eval.layouts={tmp}/hard.json"], "2 record(s) (first: 0) are 11x11 but env maze is 9x9"),
    (["model.engine_autocast=fp16"], "model.engine_autocast='fp16' is not one of"),
    (["eval.n=0"], "eval.n=0 must be >= 1"),
    (["eval.n=4"], "eval.n=4 greedy episodes of a maze are all the same; set eval.temperature>0"),
    (["eval.temperature=-1"], "eval.temperature=-1.0 must be >= 0"),
    (["eval.base_url=127.0.0.1:8000/v1", "eval.model=policy"], "an http(s) URL of an OpenAI-compatible API"),
    (["eval.base_url=http://127.0.0.1:8000/v1"], "eval.base_url is set but eval.model is not"),
    (["eval.base_url=http://127.0.0.1:8000/v1", "eval.model=p", "eval.adapter={tmp}/empty_folder"],
     "an endpoint serves its own adapters"),
    (["eval.base_url=http://127.0.0.1:8000/v1", "eval.model=p", "eval.concurrency=0"], "eval.concurrency=0: must be >= 1"),
    (["eval.model=policy"], "eval.model='policy' names a served model, but eval.base_url is not set"),
])
def test_bad_input_fails_before_any_work_with_a_clear_message(tmp_path, overrides, message):
    from rlfw.eval import run_eval

    _bad_files(tmp_path)
    cfg = compose_eval(tmp_path / "out", *[o.format(tmp=tmp_path) for o in overrides])
    with pytest.raises(ConfigError) as err:
        run_eval(cfg)
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()


def test_defaults_validate_and_hard_mazes_validate_on_a_hard_env(tmp_path):
    validate_eval(compose_eval(tmp_path))
    validate_eval(compose_eval(tmp_path, "env=maze_hard", "eval.sets=[eval64_hard,heldout]"))
