"""scripts/merge_adapter.py turns a run's adapter at step N into one model folder that computes what
the base + adapter computed, loads through `model.path=`, and records the run's metrics at N."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "checkpoints" / "tiny_vl_maze_sft"
spec = importlib.util.spec_from_file_location("merge_adapter", ROOT / "scripts" / "merge_adapter.py")
ma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ma)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run folder as rlfw.run leaves it after 3 steps: its config, Hydra's overrides, lora_sync/v2
    and v3 (v3 with a random lora_B, so it changes the policy), and metrics with evaluations at 0 and 3."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlfw.build import build_policy_model
    from rlfw.config import register_configs
    from rlfw.config_io import save_run_config
    from rlfw.models.weights import save_policy_weights

    run = tmp_path_factory.mktemp("run")
    overrides = ["experiment=maze_from_sft", "model.lora.rank=4", "seed=7"]
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("config", overrides=[*overrides, f"trainer.output_dir={run}",
                                                               f"model.path={CKPT}"]))
    save_run_config(cfg, run)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    torch.manual_seed(0)
    model, _ = build_policy_model(cfg.model, str(CKPT))
    save_policy_weights(model, run / "lora_sync", 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    save_policy_weights(model, run / "lora_sync", 3)
    rows = [{"step": 0, "eval/maze/pass_at_1": 0.25, "eval/heldout/pass_at_1": 0.2},
            {"step": 2, "policy/loss": 0.2, "timing/elapsed_min": 1.0},  # a training row, no evaluation
            {"step": 3, "policy/loss": 0.1, "train/reward_mean": 0.5},
            {"step": 3, "eval/maze/pass_at_1": 0.5, "eval/heldout/pass_at_1": 0.375, "timing/elapsed_min": 1.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_merged_folder_computes_what_base_plus_adapter_did_and_records_the_run(run, tmp_path):
    from peft import PeftModel

    from rlfw.models import load_policy
    from rlfw.validation import model_folder_errors

    out = tmp_path / "tiny_vl_maze_rl"
    proc = subprocess.run([sys.executable, "scripts/merge_adapter.py", str(run), "--step", "3", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'eval/eval64/pass_at_1': 0.5" in proc.stdout

    assert model_folder_errors(str(out), "model.path") == []  # what model.path= and rlfw.eval check
    merged, processor = load_policy(out)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base, _ = load_policy(CKPT)
    ids = torch.tensor([processor.tokenizer("go to the target, then stop")["input_ids"]])
    expected = _logits(PeftModel.from_pretrained(load_policy(CKPT)[0], str(run / "lora_sync" / "v3")).eval(), ids)
    got = _logits(merged.eval(), ids)
    assert torch.allclose(got, expected, atol=1e-5)
    assert (got - _logits(base.eval(), ids)).abs().max() > 1e-3  # the adapter changed the policy

    record = json.loads((out / "rlfw_rl.json").read_text())
    assert record["step"] == 3 and record["seed"] == 7
    assert record["command"] == "python -m rlfw.run experiment=maze_from_sft model.lora.rank=4 seed=7"
    assert record["eval/eval64/pass_at_1"] == 0.5 and record["eval/heldout/pass_at_1"] == 0.375  # step 3's, not 0's
    assert record["timing/elapsed_min"] == 1.5 and "policy/loss" not in record
    assert record["adapter"] == str(run / "lora_sync" / "v3") and record["base"] == str(CKPT)


def test_a_run_with_an_sft_stage_merges_onto_the_stage_checkpoint_not_model_path(tmp_path):
    """RL of `experiment=maze_sft_then_dagger` trains its adapter on the stage's checkpoint; merged onto
    the config's model.path (the stage's own start) it would be a different, silently worse policy."""
    from peft import PeftModel

    from rlfw.build import build_policy_model
    from rlfw.config_io import save_run_config
    from rlfw.models import load_policy, save_model_folder
    from rlfw.models.weights import save_policy_weights
    from tests.rlfw.inprocess import compose_config

    run = tmp_path / "run"
    cfg = compose_config(run, "experiment=maze_sft_then_dagger", "model.lora.rank=4", f"model.path={CKPT}")
    run.mkdir()
    save_run_config(cfg, run)
    stage = run / "sft_stage" / "checkpoint"
    model, processor = load_policy(CKPT)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_model_folder(model, processor, stage, "rlfw_sft.json", {"step": 1})
    adapter_model, _ = build_policy_model(cfg.model, str(stage))
    with torch.no_grad():
        for name, p in adapter_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    save_policy_weights(adapter_model, run / "lora_sync", 3)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "eval/maze/pass_at_1": 0.5}) + "\n")

    record = ma.merge(run, 3, tmp_path / "out")
    assert record["base"] == str(stage)
    ids = torch.tensor([processor.tokenizer("go to the target, then stop")["input_ids"]])
    got = _logits(load_policy(tmp_path / "out")[0].eval(), ids)
    on_stage = _logits(PeftModel.from_pretrained(load_policy(stage)[0], str(run / "lora_sync" / "v3")).eval(), ids)
    on_start = _logits(PeftModel.from_pretrained(load_policy(CKPT)[0], str(run / "lora_sync" / "v3")).eval(), ids)
    assert torch.allclose(got, on_stage, atol=1e-5)
    assert (got - on_start).abs().max() > 1e-3


def test_a_step_without_an_adapter_or_an_evaluation_and_a_moved_base_are_refused_before_loading(run, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"no LoRA adapter of step 5 .*saved: \[2, 3\]"):
        ma.merge(run, 5, out)
    with pytest.raises(SystemExit, match="no evaluation at step 2"):
        ma.merge(run, 2, out)
    with pytest.raises(SystemExit, match="no such model folder: give the base model folder with --base"):
        ma.merge(run, 3, out, base=str(tmp_path / "moved"))
    with pytest.raises(SystemExit, match="not an rlfw.run run folder"):
        ma.merge(tmp_path, 3, out)
    assert not out.exists()


def test_the_env_set_is_renamed_after_its_eval_set_unless_that_name_is_taken(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/maze/pass_at_1": 0.5,
                                                         "eval/heldout/pass_at_1": 0.25}) + "\n")
    assert ma.step_metrics(tmp_path, 1, "maze", "eval64") == {"eval/eval64/pass_at_1": 0.5, "eval/heldout/pass_at_1": 0.25}
    # env.eval_set=heldout beside the held-out pass: renaming would overwrite the held-out score
    assert ma.step_metrics(tmp_path, 1, "maze", "heldout") == {"eval/maze/pass_at_1": 0.5, "eval/heldout/pass_at_1": 0.25}
