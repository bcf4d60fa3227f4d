"""A training run submitted as a Ray job to a real Ray head on 127.0.0.1 (`ray start --head`),
through the Ray Jobs SDK, as `ray job submit` does: it succeeds and its logs are readable; a job
stopped mid-run (as a lost node ends it) and resubmitted with the same entrypoint continues from
its latest checkpoint to the adapter an uninterrupted run ends with; a bad override fails before
Ray reserves anything, and the job's logs say why.

The head runs with RAY_AUTH_MODE=disabled (loopback only; on a shared cluster use Ray's token
auth, see the README) and is stopped by its own process group, never `ray stop`."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
SIGNAL = ["experiment=debug", "model=tiny_vl_sft", "env.max_turns=20", "algo.n_samples_per_prompt=4",
          "algo.dynamic_sampling=resample", "trainer.total_steps=2", "trainer.eval_interval=0",
          "trainer.ckpt_interval=1", "trainer.resume_mode=latest", "cluster.ray_address=auto", "logger=console"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A Ray head with its job server and metrics export, on loopback; yields (dashboard address,
    metrics URL)."""
    temp = Path(f"/tmp/rlfw-ray-{os.getpid()}")  # Ray's socket paths must stay short
    port, dash, metrics = _free_port(), _free_port(), _free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_metrics_report_interval_ms="1000", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                             "--node-ip-address", "127.0.0.1", "--port", str(port), "--dashboard-host", "127.0.0.1",
                             "--dashboard-port", str(dash), "--temp-dir", str(temp), "--num-cpus", "2",
                             "--include-dashboard", "true", "--metrics-export-port", str(metrics)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, "ray start exited"
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:
                assert time.time() < deadline, "the Ray head's job server did not come up"
                time.sleep(1)
        yield address, f"http://127.0.0.1:{metrics}/metrics", metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the head and everything it started, nothing else
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def prometheus(head, tmp_path_factory):
    """A real Prometheus server (the Debian `prometheus` package; `.ci/run` installs it) on
    127.0.0.1, scraping the head's metrics export every second; yields its HTTP API address."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus; .ci/run does)")
    root = tmp_path_factory.mktemp("prometheus")
    (root / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: ray\n    static_configs: [{{targets: ['127.0.0.1:{head[2]}']}}]\n")
    port = _free_port()
    proc = subprocess.Popen([binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        import urllib.request

        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, "prometheus exited"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "prometheus did not become ready"
                time.sleep(0.5)
        yield api
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _entrypoint(out: Path, *extra: str) -> str:
    return f"cd {ROOT} && python -m rlfw.run " + " ".join([*SIGNAL, f"trainer.output_dir={out}", *extra])


def _wait(client, job_id: str, timeout_s: float = 400):
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout_s
    while (status := client.get_job_status(job_id)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.time() < deadline, f"job {job_id} still {status}"
        time.sleep(1)
    return status


def _adapter(out: Path, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / "lora_sync" / f"v{version}" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def prometheus_or_none(request):
    """Prometheus when installed (started before the job, so it scrapes while the job runs)."""
    try:
        return request.getfixturevalue("prometheus")
    except pytest.skip.Exception:
        return None


@pytest.fixture(scope="module")
def uninterrupted(head, prometheus_or_none, tmp_path_factory):
    from ray.job_submission import JobStatus, JobSubmissionClient

    import urllib.request

    address, metrics_url, _ = head
    client = JobSubmissionClient(address)
    out = tmp_path_factory.mktemp("job") / "run"
    job = client.submit_job(entrypoint=_entrypoint(out))
    exported = ""  # Ray's Prometheus export of the run's gauges, read while the job runs
    deadline = time.time() + 400
    while client.get_job_status(job) in {JobStatus.PENDING, JobStatus.RUNNING} and time.time() < deadline:
        try:
            text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
            if 'rlfw_train_episodes{' in text:
                exported = text
        except OSError:
            pass
        time.sleep(1)
    status = _wait(client, job)
    logs = client.get_job_logs(job)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    return out, logs, exported


def test_a_submitted_run_succeeds_and_its_logs_are_readable(uninterrupted):
    out, logs, _ = uninterrupted
    assert f"outputs in {out}" in logs
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "policy/loss" in r] == [1, 2]


def test_the_runs_metrics_reach_rays_prometheus_export(uninterrupted):
    """Every metric is a Ray gauge rlfw_<name> tagged with the run; the head's metrics export port
    serves them in Prometheus's format, with the values metrics.jsonl has for that step."""
    import re

    out, _, exported = uninterrupted
    assert exported, "no rlfw_ gauge was exported while the job ran"

    def value(name: str) -> float:
        m = re.search(rf'^(?:ray_)?{name}\{{[^}}]*run="run"[^}}]*\}} (\S+)$', exported, re.M)
        assert m, f"{name} not exported"
        return float(m.group(1))

    step = int(value("rlfw_step"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    row = [r for r in rows if r["step"] == step and "train/episodes" in r][-1]
    assert value("rlfw_train_episodes") == row["train/episodes"]
    assert value("rlfw_train_success_rate") == pytest.approx(row["train/success_rate"])
    for name in ("rlfw_timing_generate", "rlfw_timing_train", "rlfw_timing_sync", "rlfw_policy_entropy"):
        value(name)
    # the shipped Grafana dashboard queries names that are exported (the KL term needs use_kl_loss,
    # eval metrics an evaluation: this run has neither)
    dashboard = (ROOT / "deploy" / "grafana" / "rlfw_dashboard.json").read_text()
    queried = {n for n in re.findall(r"ray_rlfw_\w+", dashboard) if not n.startswith("ray_rlfw_eval_")}
    queried -= {"ray_rlfw_policy_kl"}
    missing = {n for n in queried if not re.search(rf"^{n}\{{", exported, re.M)}
    assert not missing, missing


def test_prometheus_scrapes_the_runs_metrics(prometheus, uninterrupted):
    """Queried from Prometheus's HTTP API after the run: the highest step it scraped, and the
    episodes logged at that step, equal metrics.jsonl's."""
    import urllib.parse
    import urllib.request

    out = uninterrupted[0]

    def query(expr: str) -> float:
        url = f"{prometheus}/query?" + urllib.parse.urlencode({"query": expr})
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success" and body["data"]["result"], (expr, body)
        return float(body["data"]["result"][0]["value"][1])

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/episodes" in r]
    assert query('max(max_over_time({__name__=~"(ray_)?rlfw_step", run="run"}[15m]))') in {r["step"] for r in train}
    episodes = query('last_over_time({__name__=~"(ray_)?rlfw_train_episodes", run="run"}[15m])')
    assert episodes in {r["train/episodes"] for r in train}


@pytest.mark.slow  # run by .ci/run
def test_a_stopped_job_resubmitted_continues_from_its_checkpoint(head, uninterrupted, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(head[0])
    out = tmp_path / "run"
    entrypoint = _entrypoint(out)
    first = client.submit_job(entrypoint=entrypoint)
    deadline = time.time() + 300
    pointer = out / "checkpoints"
    while not (pointer / "global_step_1").exists():
        assert client.get_job_status(first) in {JobStatus.PENDING, JobStatus.RUNNING} and time.time() < deadline
        time.sleep(0.2)
    client.stop_job(first)  # as a lost node ends it
    assert _wait(client, first) == JobStatus.STOPPED
    second = client.submit_job(entrypoint=entrypoint)  # the same entrypoint, resubmitted
    status = _wait(client, second)
    logs = client.get_job_logs(second)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    run_log = (out / "run.log").read_text()
    assert "(Terminated: SIGTERM)" in run_log  # the stopped job said where it stopped
    assert "resum" in run_log.lower()
    want, got = _adapter(uninterrupted[0], 2), _adapter(out, 2)
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-4)


def test_a_bad_override_fails_before_ray_reserves_anything_and_the_logs_say_why(head, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(head[0])
    job = client.submit_job(entrypoint=_entrypoint(tmp_path / "run", "algo.lr=0"))
    assert _wait(client, job, 120) == JobStatus.FAILED
    logs = client.get_job_logs(job)
    assert "algo.lr=0" in logs and "must be > 0" in logs
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_unreachable_ray_address_fails_fast_with_the_address_tried(tmp_path):
    port = _free_port()  # nothing listens there
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "rlfw.run", "experiment=debug", f"trainer.output_dir={tmp_path}",
                           f"cluster.ray_address=127.0.0.1:{port}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert proc.returncode != 0
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in proc.stderr + proc.stdout
    assert time.time() - t0 < 60
