"""A metrics export port already in use never stops training: Ray 2.60 would not start with it (its
metrics agent dies and the node times out during startup), so rlfw reports it in run.log and lets
Ray pick a free port (`cluster.metrics_export_port`, `rlfw.distributed.ray_runtime`)."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlfw.distributed.ray_runtime import metrics_export_port

ROOT = Path(__file__).resolve().parents[2]


def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def test_a_busy_port_is_given_up_with_the_reason():
    with _busy_port() as busy:
        port = busy.getsockname()[1]
        assert metrics_export_port(port)[0] is None and "in use" in metrics_export_port(port)[1]
    assert metrics_export_port(port) == (port, "")  # free again
    assert metrics_export_port(None) == (None, "")
    assert metrics_export_port(70000)[0] is None


@pytest.mark.slow  # a real debug run through Ray (about a minute); run by .ci/run
def test_a_run_whose_metrics_export_port_is_in_use_trains_and_says_so(tmp_path):
    with _busy_port() as busy:  # bound on loopback, as another exporter would hold it
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "rlfw.run", "experiment=debug", "trainer.total_steps=1", "trainer.eval_interval=0",
             "logger.tensorboard=false", "logger.wandb.mode=disabled", f"cluster.metrics_export_port={port}",
             f"trainer.output_dir={tmp_path}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "policy/loss" in r] == [1]
    log = (tmp_path / "run.log").read_text()
    line = next(line for line in log.splitlines() if f"cluster.metrics_export_port={port} cannot be used" in line)
    assert "Address already in use" in line and re.search(r"on port \d+ instead", line), line
