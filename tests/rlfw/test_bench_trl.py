"""scripts/bench_trl.py runs at smoke sizes, with TRL and without it; timings are printed, never asserted."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = "| side | samples/s | s/step | min s/step | mean reward | completion tokens/sample |"


def run_smoke(env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "scripts/bench_trl.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert TABLE in proc.stdout and "| rlfw |" in proc.stdout
    assert "command: python scripts/bench_trl.py --smoke" in proc.stdout
    return proc


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason='needs pip install -e ".[bench]"')
def test_bench_trl_smoke():
    out = run_smoke().stdout
    assert "| TRL |" in out and "rlfw / TRL samples/s:" in out


def test_bench_trl_smoke_without_trl(tmp_path):
    blocked = tmp_path / "trl"
    blocked.mkdir()
    (blocked / "__init__.py").write_text("raise ImportError('trl blocked by the test')\n")
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = run_smoke(env).stdout
    assert 'pip install -e ".[bench]"' in out and "| TRL |" not in out
