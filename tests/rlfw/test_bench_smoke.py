"""The rollout benchmark runs (smoke sizes) so it cannot rot; timings are printed, never asserted."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_rollout_smoke():
    proc = subprocess.run([sys.executable, "scripts/bench_rollout.py", "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| episodes/s |" in proc.stdout and "rlfw / naive" in proc.stdout


def test_bench_checkpoint_smoke():
    proc = subprocess.run([sys.executable, "scripts/bench_checkpoint.py", "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| LoRA r16 |" in proc.stdout and "| full fine-tuning |" in proc.stdout
