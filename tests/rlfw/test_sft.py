"""SFT on oracle demonstrations drives the loss down and writes a checkpoint that model.path accepts."""

import json

import numpy as np
import pytest

from rlfw.config import (LoggerConfig, LoraConfig, MazeEnvConfig, ModelConfig, SFTConfig, SFTRunConfig, TinyVLSpec,
                         WandbConfig)
from rlfw.rollout.demos import DemoSampler, to_segment
from rlfw.sft import run_sft


def _cfg(tmp_path, **sft) -> SFTRunConfig:
    return SFTRunConfig(
        env=MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=4, eval_set="eval64"),
        model=ModelConfig(name="tiny_vl", lora=LoraConfig(rank=0),
                          tiny=TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128, vision_depth=1,
                                          image_crop_px=8)),
        logger=LoggerConfig(name="console", console=False, tensorboard=False, wandb=WandbConfig(mode="disabled")),
        sft=SFTConfig(output_dir=str(tmp_path), torch_threads=1, **sft),
    )


def test_sft_lowers_loss_and_writes_loadable_checkpoint(tmp_path):
    cfg = _cfg(tmp_path, steps=40, batch_size=16, lr=3e-3, warmup_steps=5, eval_interval=40, eval_size=4)
    run_sft(cfg)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert losses[-1] < 0.5 * losses[0], losses
    assert any("eval/heldout/pass_at_1" in r for r in rows) and any("eval/eval64/pass_at_1" in r for r in rows)

    from rlfw.build import build_policy_model
    from rlfw.models.processing import PolicyProcessor

    ckpt = tmp_path / "checkpoint"
    info = json.loads((ckpt / "rlfw_sft.json").read_text())
    assert info["step"] == 40 and "command" in info
    model, processor = build_policy_model(ModelConfig(name="tiny_vl", path=str(ckpt)), str(ckpt))
    assert processor.crop_px == 8 and hasattr(model, "peft_config")  # LoRA on top of the SFT weights
    assert (tmp_path / "snapshots" / "step_000040" / "config.json").exists()


@pytest.mark.parametrize("model_compile, sft_compile, compiled", [(False, None, False), (True, None, True),
                                                                    (False, True, True), (True, False, False)])
def test_sft_compile_takes_the_place_of_model_compile(tmp_path, monkeypatch, model_compile, sft_compile, compiled):
    """sft.compile, when set, decides whether the SFT run compiles its training forward (an SFT stage
    compiled alone before an eager RL stage); None follows model.compile. The compiled forward itself
    is tested in tests/rlfw/test_train_speed.py."""
    import rlfw.models

    calls = []
    monkeypatch.setattr(rlfw.models, "compile_language_model", lambda model: calls.append(model))
    cfg = _cfg(tmp_path, steps=1, batch_size=2, eval_interval=0, eval_size=4, compile=sft_compile)
    cfg.model.compile = model_compile
    run_sft(cfg)
    assert len(calls) == int(compiled)


def test_sft_stops_at_its_time_limit_with_an_evaluation_and_a_checkpoint(tmp_path):
    cfg = _cfg(tmp_path, steps=10_000, batch_size=4, eval_interval=5_000, eval_size=4, max_minutes=0.05)
    metrics = run_sft(cfg)
    info = json.loads((tmp_path / "checkpoint" / "rlfw_sft.json").read_text())
    assert 1 <= info["step"] < 5_000 and metrics["timing/elapsed_min"] >= 0.05
    assert "eval/heldout/pass_at_1" in info
    assert [p.name for p in (tmp_path / "eval").iterdir()] == [f"step_{info['step']:06d}"]


def test_sft_without_evaluations_stops_at_its_time_limit_without_one(tmp_path):
    """eval_interval=0 (an SFT stage before RL): the time limit ends it with the checkpoint alone."""
    cfg = _cfg(tmp_path, steps=10_000, batch_size=4, eval_interval=0, eval_size=4, max_minutes=0.05)
    assert run_sft(cfg) == {}
    info = json.loads((tmp_path / "checkpoint" / "rlfw_sft.json").read_text())
    assert 1 <= info["step"] < 10_000 and not any(k.startswith("eval/") for k in info)
    assert not (tmp_path / "eval").exists() and not (tmp_path / "snapshots").exists()


def test_sft_scheduled_by_minutes_decays_over_its_time_and_stops_there(tmp_path):
    """schedule=minutes: the cosine spans max_minutes of wall time, not sft.steps (a cap here far
    beyond reach), so the LR is near its peak early and near zero by the limit, where the run ends."""
    cfg = _cfg(tmp_path, steps=100_000, batch_size=2, lr=1e-3, warmup_steps=0, decay_fraction=1.0,
               eval_interval=0, eval_size=4, max_minutes=0.15, schedule="minutes")
    run_sft(cfg)
    lrs = [r["sft/lr"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "sft/lr" in r]
    info = json.loads((tmp_path / "checkpoint" / "rlfw_sft.json").read_text())
    assert 20 <= info["step"] < 100_000 and len(lrs) >= 2
    assert lrs[0] > 0.9e-3 and lrs[-1] < 0.1e-3 and lrs == sorted(lrs, reverse=True), (info["step"], lrs)


@pytest.mark.parametrize("mode, noise", [("all_squares", 0.0), ("oracle_path", 0.3)])
def test_demonstrations_are_in_the_rl_turn_format(tmp_path, mode, noise):
    from rlfw.build import make_env_fn, prepare_base_model
    from rlfw.models.processing import PolicyProcessor

    cfg = _cfg(tmp_path)
    processor = PolicyProcessor.from_pretrained(prepare_base_model(cfg.model, make_env_fn(cfg.env), tmp_path, 0))
    make_env = make_env_fn(cfg.env, processor.crop_px)  # the policy's observations
    sampler = DemoSampler(make_env, seed=0, mode=mode, noise=noise)
    actions = set(make_env().unwrapped.action_strings)
    for image, task, feedback, action in sampler.sample(32):
        assert action in actions and image.dtype == np.uint8
        seg = to_segment(processor, image, task, feedback, action)
        supervised = [t for t, m in zip(seg.token_ids, seg.loss_mask) if m]
        assert processor.decode(supervised[:1]) == action  # each action is one token
        assert supervised[-1] == processor.eos_token_id and len(supervised) == 2


def test_junction_states_are_junctions_entered_by_a_move_and_labelled_there():
    """sft.junction_fraction: a junction state is a square with three or four open neighbours, its
    feedback the genuine move into it (not a wall bump: that would leave the agent on the neighbour),
    its label the oracle's move from that square (not from the neighbour one move earlier); at 0 the
    draw is the one without the option, and a fraction in between mixes the two."""
    from envs.actions import MOVED_FEEDBACK, DIRECTION_NAMES
    from rlfw.build import make_env_fn
    from tests.envs.helpers import labelled_draws as drawn

    make_env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0"))

    states = drawn(DemoSampler(make_env, 0, "all_squares", 0.0, junction_fraction=1.0), 200)
    assert all(junction for junction, *_ in states)
    moved = {MOVED_FEEDBACK.format(direction=d) for d in DIRECTION_NAMES}
    assert all(feedback in moved for _, feedback, *_ in states)
    assert all(action == oracle for _, _, action, oracle, _ in states)
    assert len({feedback for _, feedback, *_ in states}) == 4  # entered from every side
    assert len({action for _, _, action, *_ in states}) >= 4

    plain, off = (drawn(DemoSampler(make_env, 0, "all_squares", 0.0, **kw), 100) for kw in ({}, {"junction_fraction": 0.0}))
    assert all(a[1:4] == b[1:4] and np.array_equal(a[4], b[4]) for a, b in zip(plain, off))
    uniform = np.mean([junction for junction, *_ in plain])
    mixed = np.mean([junction for junction, *_ in drawn(DemoSampler(make_env, 0, "all_squares", 0.0, junction_fraction=0.5), 300)])
    assert uniform < 0.15 and 0.4 < mixed < 0.7, (uniform, mixed)


def test_sft_with_lora_trains_the_adapter(tmp_path):
    """LoRA on the shipped checkpoint: training reaches the adapter (the evaluation engine must not
    merge it into the model being trained) and lowers the loss on fresh demonstrations."""
    import torch

    from rlfw.build import make_env_fn
    from rlfw.config import repo_root
    from rlfw.models import load_policy
    from rlfw.sft import sft_loss

    shipped = f"{repo_root()}/checkpoints/tiny_vl_maze_sft"
    cfg = _cfg(tmp_path, steps=20, batch_size=16, lr=3e-3, warmup_steps=0, eval_interval=20, eval_size=4)
    cfg.model = ModelConfig(name="tiny_vl_sft", path=shipped, lora=LoraConfig(rank=8, alpha=16))
    run_sft(cfg)
    start, processor = load_policy(shipped)
    tuned, _ = load_policy(tmp_path / "checkpoint")  # LoRA merged into the saved weights
    name = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(start.state_dict()[name], tuned.state_dict()[name])
    demos = DemoSampler(make_env_fn(cfg.env, processor.crop_px), seed=123, mode="all_squares", noise=0.0).sample(128)
    segments = [to_segment(processor, *d) for d in demos]
    with torch.no_grad():
        before, after = (sft_loss(m.eval(), processor, segments)[0].item() for m in (start, tuned))
    assert after < before
