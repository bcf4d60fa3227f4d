"""The benchmarks run (smoke sizes) so they cannot rot; timings are printed, never asserted."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke(script: str) -> str:
    """`python scripts/<script> --smoke`'s output; it must exit 0."""
    proc = subprocess.run([sys.executable, f"scripts/{script}", "--smoke"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_bench_rollout_smoke():
    out = _smoke("bench_rollout.py")
    assert "| episodes/s |" in out and "| s per training step (rollout + update) |" in out
    assert "| batched generate | per-episode generate | rlfw / batched | rlfw / per-episode |" in out


@pytest.mark.slow  # about a minute: every section of bench.py; the sections' own smokes stay in the default run
def test_bench_smoke_writes_every_section(tmp_path):
    """scripts/bench.py: machine limit, rollout, training (TRL and memory have their own tests:
    test_bench_trl.py, and the end-to-end run's memory metrics)."""
    out = tmp_path / "results.md"
    proc = subprocess.run([sys.executable, "scripts/bench.py", "--smoke", "--skip", "trl", "memory", "vllm", "serve", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    for heading in ("## 1. Machine limit", "## 2. Rollout", "## 3. Training", "## 6. FSDP2"):
        assert heading in text
    assert "| LoRA r32 | 2 | " in text and "| full fine-tuning | 1 | " in text  # both rank counts ran
    assert "| matmul float32" in text and "| rollout episodes/s |" in text and "of fp32 matmul limit" in text
    assert "| rlfw / batched | rlfw / per-episode |" in text
    # the training forward's speed settings, each measured against the defaults in the same run
    assert "model: attn_implementation=eager, train_autocast=auto, compile=True (" in text  # and what auto chose
    assert "x the defaults' tokens/s" in text
    assert "reproduce: `python scripts/bench.py --smoke" in text


def test_bench_checkpoint_smoke():
    out = _smoke("bench_checkpoint.py")
    assert "| LoRA r16 |" in out and "| full fine-tuning |" in out


def test_plot_curves_and_before_after_table(tmp_path):
    import json

    rows = [{"step": 0, "eval/eval64/pass_at_1": 0.4, "eval/eval64/solvable_fraction": 1.0, "timing/elapsed_min": 0.1},
            {"step": 1, "train/reward_mean": 0.5},
            {"step": 5, "eval/eval64/pass_at_1": 0.9, "eval/eval64/solvable_fraction": 1.0, "timing/elapsed_min": 3.0}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "curve.png"
    proc = subprocess.run([sys.executable, "scripts/plot_curves.py", str(metrics), "--label", "grpo", "--x", "minutes",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| eval64 | 0.400 (step 0) | 0.900 (step 5) | 1.000 |" in proc.stdout
    assert out.stat().st_size > 1000


def test_bench_prompt_length_smoke():
    """scripts/bench_prompt_length.py: both rows, and the cut prompt is `--cut` tokens shorter."""
    proc = subprocess.run([sys.executable, "scripts/bench_prompt_length.py", "--batch", "2", "--steps", "2",
                           "--threads", "1", "--cut", "30"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2] for line in proc.stdout.splitlines()
            if line.startswith("| as used") or line.startswith("| 30 text tokens cut")}
    assert float(rows["as used"]) - float(rows["30 text tokens cut"]) == 30
    assert "speed-up from the shorter prompt" in proc.stdout


def test_bench_engine_autocast_smoke():
    """scripts/bench_engine_autocast.py: both engines timed, and the greedy check compares their replies."""
    out = _smoke("bench_engine_autocast.py")
    assert "| float32 |" in out and "| bf16 autocast |" in out
    assert "first turns of 4 mazes, greedy: the same reply on" in out


def test_bench_vision_attention_smoke():
    """scripts/bench_vision_attention.py: both sides timed on SFT steps and rollouts."""
    out = _smoke("bench_vision_attention.py")
    assert "| SFT step (states/s) |" in out and "| rollout (turns/s) |" in out
    assert "batched / loop" in out


def test_bench_sft_data_smoke():
    """scripts/bench_sft_data.py: each part of the SFT data path timed on both sides."""
    out = _smoke("bench_sft_data.py")
    for row in ("| drawing states (states/s) |", "| encoding states (states/s) |",
                "| reset to a layout (resets/s) |", "| the data path (states/s) |"):
        assert row in out
    assert "now / before" in out


def test_bench_last_layer_smoke():
    """scripts/bench_last_layer.py: both sides timed on SFT steps."""
    out = _smoke("bench_last_layer.py")
    assert "| SFT step (states/s, forward + backward + AdamW) |" in out and "kept / every" in out
