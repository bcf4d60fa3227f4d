"""The shipped SFT checkpoint loads through the normal path and still scores what it records."""

import json
from pathlib import Path

from rlfw.build import build_policy_model, eval_tasks, make_env_fn
from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig
from rlfw.evaluate import evaluate
from rlfw.rollout.agent_loop import LoopLimits
from rlfw.rollout.engine import TransformersEngine

CKPT = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny_vl_maze_sft"


def test_shipped_sft_checkpoint_reproduces_its_eval64_pass_at_1():
    recorded = json.loads((CKPT / "rlfw_sft.json").read_text())
    env = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", eval_set="eval64", max_turns=20)
    model, processor = build_policy_model(ModelConfig(name="tiny_vl", path=str(CKPT), lora=LoraConfig(rank=0)),
                                          str(CKPT))
    tasks, layouts = eval_tasks(env)
    make_env = make_env_fn(env)
    metrics, _ = evaluate(TransformersEngine(model, processor), processor, [make_env() for _ in tasks], tasks, layouts,
                          LoopLimits(max_turns=20, max_new_tokens=env.max_new_tokens, max_episode_tokens=4096),
                          "eval64")
    assert metrics["eval/eval64/pass_at_1"] == recorded["eval/eval64/pass_at_1"]
    assert 0.35 <= metrics["eval/eval64/pass_at_1"] <= 0.55  # the GRPO starting point the issue asks for
