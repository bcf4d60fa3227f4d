"""The shipped checkpoints load through the normal path and still score what they record."""

import json
from pathlib import Path

import pytest

from rlfw.build import build_policy_model, eval_tasks, make_env_fn
from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig
from rlfw.evaluate import evaluate
from rlfw.rollout.agent_loop import LoopLimits
from rlfw.rollout.engine import TransformersEngine

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"
# the GRPO starting points the issue asks for (35-55% on eval64), the long SFT run continued from them,
# and the RL policy shipped from a run started at tiny_vl_maze_sft (above that start's 0.406)
EXPECTED_RANGE = {"tiny_vl_maze_sft": (0.35, 0.55), "tiny_vl_maze_sft_mid": (0.35, 0.55),
                  "tiny_vl_maze_sft_long": (0.9, 1.0), "tiny_vl_maze_rl": (0.5, 1.0)}
# each folder's record: rlfw.sft's, or scripts/merge_adapter.py's for a merged rlfw.run adapter
RECORD = {"tiny_vl_maze_rl": "rlfw_rl.json"}


@pytest.mark.parametrize("name", sorted(EXPECTED_RANGE))
def test_shipped_checkpoint_reproduces_its_eval64_pass_at_1(name):
    ckpt = CHECKPOINTS / name
    recorded = json.loads((ckpt / RECORD.get(name, "rlfw_sft.json")).read_text())
    env = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", eval_set="eval64", max_turns=20)
    model, processor = build_policy_model(ModelConfig(name="tiny_vl", path=str(ckpt), lora=LoraConfig(rank=0)),
                                          str(ckpt))
    tasks, layouts = eval_tasks(env)
    make_env = make_env_fn(env, 8)  # the shipped policy reads the maze without its outer wall
    metrics, _ = evaluate(TransformersEngine(model, processor), processor, [make_env() for _ in tasks], tasks, layouts,
                          LoopLimits(max_turns=20, max_new_tokens=env.max_new_tokens, max_episode_tokens=4096),
                          "eval64")
    assert metrics["eval/eval64/pass_at_1"] == recorded["eval/eval64/pass_at_1"]
    low, high = EXPECTED_RANGE[name]
    assert low <= metrics["eval/eval64/pass_at_1"] <= high
