"""Checkpoints on S3-compatible storage, against a real S3 server (moto) started on loopback."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlfw import checkpoint
from tests.rlfw.test_checkpoint import FakePolicy, _cfg

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=endpoint, **creds).create_bucket(Bucket="rlfw")
    options = {"endpoint_url": endpoint, "key": "test", "secret": "test"}
    yield options
    server.stop()


def test_s3_store_saves_verifies_and_falls_back(s3):
    store = checkpoint.CheckpointStore("s3://rlfw/unit", s3)
    checkpoint.preflight("s3://rlfw/unit", s3)
    for step in (1, 2, 3):
        store.save(step, FakePolicy(step), _cfg(), max_to_keep=2)
    assert sorted(p.rsplit("/", 1)[1] for p in store._step_dirs()) == ["global_step_2", "global_step_3"]
    assert store.find_resume(log=print).step == 3
    # corrupt the newest policy state in place: resume falls back to step 2
    store.fs.pipe(f"{store.root}/global_step_3/{checkpoint.POLICY_STATE}", b"garbage")
    messages = []
    assert store.find_resume(log=messages.append).step == 2
    assert "checksum" in messages[0] or "bytes" in messages[0]


@pytest.mark.slow
def test_run_checkpoints_to_s3_and_resumes(s3, tmp_path):
    out = tmp_path / "run"
    common = [sys.executable, "-m", "rlfw.run", "experiment=debug", "trainer.eval_interval=0",
              "trainer.ckpt_interval=1", "trainer.hf_save_interval=2", f"trainer.output_dir={out}",
              "trainer.ckpt_path=s3://rlfw/e2e"] + [f"+trainer.ckpt_storage_options.{k}={v}" for k, v in s3.items()]
    first = subprocess.run(common + ["trainer.total_steps=2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    second = subprocess.run(common + ["trainer.total_steps=3", "trainer.resume_mode=latest"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from s3://rlfw/e2e/global_step_2" in second.stdout + second.stderr
    store = checkpoint.CheckpointStore("s3://rlfw/e2e", s3)
    assert store.find_resume().step == 3
    assert store.fs.exists(f"{store.root}/global_step_2/policy/adapter_model.safetensors")
