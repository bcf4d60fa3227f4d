"""scripts/bench_env.py runs (tiny counts, no timing assertion)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke():
    out = subprocess.run(
        [sys.executable, "scripts/bench_env.py", "--smoke"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "| cell_px | image | reset/s | step/s | render/s |" in out.stdout
    assert "| 25 | 225x225 |" in out.stdout and "| 8 | 72x72 |" in out.stdout
