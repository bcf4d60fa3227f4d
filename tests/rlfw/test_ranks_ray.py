"""Two FSDP2 trainer ranks through Ray (`cluster=local_2ranks`), as a user runs them: the same
training as one rank, and a rank killed with SIGKILL mid-run is replaced (all workers, resumed from
the latest checkpoint) to the same final adapter as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.rlfw.procs import worker_pids

ROOT = Path(__file__).resolve().parents[2]
# the shipped policy with dynamic sampling: groups with successes and failures, so the adapter moves
SIGNAL = ["experiment=debug", "model=tiny_vl_sft", "env.max_turns=20", "algo.n_samples_per_prompt=4",
          "algo.dynamic_sampling=resample", "trainer.total_steps=2", "trainer.eval_interval=0",
          "trainer.ckpt_interval=1"]


def _cmd(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "rlfw.run", *SIGNAL, f"trainer.output_dir={out}", *overrides]


def _run(out: Path, *overrides: str) -> None:
    proc = subprocess.run(_cmd(out, *overrides), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _train_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "policy/loss" in r]


def _adapter(out: Path, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / "lora_sync" / f"v{version}" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "run"
    _run(out, "cluster=local_2ranks")
    return out


@pytest.mark.slow  # run by .ci/run
def test_two_ranks_train_like_one_through_ray(two_ranks, tmp_path):
    one = tmp_path / "one"
    _run(one, "cluster=local", "cluster.num_engines=2")  # the same engines; one trainer rank
    a, b = _train_rows(one), _train_rows(two_ranks)
    assert [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        assert rb["policy/engine_weights_version"] == rb["step"]  # each step's adapter reached the engines
        assert rb["train/advantage_abs_mean"] > 0
        assert {k: v for k, v in ra.items() if k.startswith("train/")} == \
            {k: v for k, v in rb.items() if k.startswith("train/")}  # the same episodes
        for k in ("policy/loss", "policy/grad_norm", "policy/entropy"):
            assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-6), k
    want, got = _adapter(one, 2), _adapter(two_ranks, 2)
    assert want.keys() == got.keys() and any(float(v.abs().sum()) > 0 for k, v in want.items() if "lora_B" in k)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-4)


@pytest.mark.slow  # run by .ci/run
def test_a_killed_rank_is_replaced_and_the_run_ends_where_an_uninterrupted_one_does(two_ranks, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(out, "cluster=local_2ranks"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and any(json.loads(line).get("step", 0) >= 1 and "timing/checkpoint" in line
                                            for line in metrics.read_text().splitlines())):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        ranks = worker_pids(proc.pid, "ray::PolicyWorker")  # this run's trainer ranks only
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    assert "a trainer rank died" in (out / "run.log").read_text()
    assert [r["step"] for r in _train_rows(out)][-1] == 2
    want, got = _adapter(two_ranks, 2), _adapter(out, 2)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-4)
