"""Sweep reports: `python -m rlfw.run -m ...` ends with summary.csv/md/png in the sweep folder, one row per
job (failed jobs included), and `python -m rlfw.report <sweep folder>` rebuilds them from the folders alone;
jobs run in parallel through the joblib launcher, and an Optuna study (`experiment=sweep_optuna_debug`)
maximizes `sweep.objective`, failed trials recorded without ending the study."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from rlfw.config import Config, register_configs
from rlfw.run import check_objective, objective, oversubscription
from rlfw.sweep_report import STATUS_FILE, SweepReportCallback, summarize, swept_keys, to_csv, write_summary
from rlfw.validation import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["status", "final_pass_at_1", "best_pass_at_1", "best_step", "steps", "wall_min", "dir", "error"]


def _rows(sweep: Path) -> list[dict]:
    with open(sweep / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


# ---- hand-made folders (no runs) ----

def _job(sweep: Path, num: int, overrides: list[str], metrics: list[dict] | None = None, status: dict | None = None,
         run_log: str | None = None, total_steps: int | None = None) -> Path:
    d = sweep / f"{num}_{','.join(o for o in overrides if not o.startswith('experiment='))}"
    (d / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), d / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), d / ".hydra" / "hydra.yaml")
    if metrics is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if status is not None:
        (d / STATUS_FILE).write_text(json.dumps({**status, "run_dir": str(d)}))
    if run_log is not None:
        (d / "run.log").write_text(run_log)
    if total_steps is not None:
        OmegaConf.save(OmegaConf.create({"trainer": {"total_steps": total_steps}}), d / "config.yaml")
    return d


def test_summary_of_hand_made_job_folders(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": ["experiment=debug", "algo.lr=1e-4,2e-4",
                                                                       "env.max_turns=2,3"]}}}), sweep / "multirun.yaml")
    ev = lambda step, p, minutes: {"step": step, "eval/all/pass_at_1": p, "eval/maze/pass_at_1": p,  # noqa: E731
                                   "timing/elapsed_min": minutes}
    # job 0: ok, best (0.5 at step 2) above final (0.25 at step 4); the wall time is the callback's
    _job(sweep, 0, ["experiment=debug", "algo.lr=0.0001", "env.max_turns=2"],
         [ev(0, 0.125, 0.5), {"step": 1}, ev(2, 0.5, 1.0), {"step": 3}, ev(4, 0.25, 2.0)],
         {"status": "ok", "error": "", "wall_min": 2.5})
    # job 1: failed before it wrote anything (a config rejected by rlfw.validation)
    _job(sweep, 1, ["experiment=debug", "algo.lr=0.0001", "env.max_turns=3"], None,
         {"status": "failed", "error": "ConfigError: invalid config: - algo.lr=0.0 must be > 0", "wall_min": 0.01})
    # job 2: no job_status.json (swept without the callback); run.log says training stopped
    _job(sweep, 2, ["experiment=debug", "algo.lr=0.0002", "env.max_turns=2"], [ev(0, 0.0, 0.3), {"step": 1}],
         run_log="2026-01-01 00:00:00 rlfw: training stopped after step 1 (RuntimeError: boom); no checkpoints\n",
         total_steps=4)
    # job 3: no job_status.json, reached trainer.total_steps: ok; the wall time is the run's elapsed_min
    _job(sweep, 3, ["experiment=debug", "algo.lr=0.0002", "env.max_turns=3"], [ev(0, 0.0, 0.3), ev(4, 0.75, 1.75)],
         total_steps=4)
    # job 10 sorts after job 3 (by number, not by name); no status, stopped early: unfinished
    _job(sweep, 10, ["experiment=debug", "algo.lr=0.0003", "env.max_turns=3"], [ev(0, 0.0, 0.3)], total_steps=4)

    sweep_ = write_summary(sweep)
    assert sweep_.keys == ["algo.lr", "env.max_turns"]
    assert (sweep / "summary.png").stat().st_size > 0
    assert (sweep / "summary.csv").read_text().splitlines() == [
        "job,algo.lr,env.max_turns," + ",".join(COLUMNS),
        "0,0.0001,2,ok,0.2500,0.5000,2,4,2.50,\"0_algo.lr=0.0001,env.max_turns=2\",",
        "1,0.0001,3,failed,,,,0,0.01,\"1_algo.lr=0.0001,env.max_turns=3\","
        "ConfigError: invalid config: - algo.lr=0.0 must be > 0",
        "2,0.0002,2,failed,0.0000,0.0000,0,1,0.30,\"2_algo.lr=0.0002,env.max_turns=2\","
        "training stopped after step 1 (RuntimeError: boom); no checkpoints",
        "3,0.0002,3,ok,0.7500,0.7500,4,4,1.75,\"3_algo.lr=0.0002,env.max_turns=3\",",
        "10,0.0003,3,unfinished,0.0000,0.0000,0,0,0.30,\"10_algo.lr=0.0003,env.max_turns=3\",",
    ]
    md = (sweep / "summary.md").read_text()
    assert "5 jobs: 2 ok, 2 failed, 1 unfinished" in md
    assert "Best final pass@1: 0.750, job 3 (algo.lr=0.0002, env.max_turns=3)" in md
    assert md.count("\n| ") == 6  # header and 5 rows
    # a pure function of the folders: building again gives the same text
    assert to_csv(summarize(sweep)) == (sweep / "summary.csv").read_text()

    # without multirun.yaml the swept keys are those whose values differ between jobs
    (sweep / "multirun.yaml").unlink()
    assert summarize(sweep).keys == ["algo.lr", "env.max_turns"]


def _hydra_cfg(sweep: Path, job_dir: Path, mode: RunMode = RunMode.MULTIRUN):
    return OmegaConf.create({"hydra": {"mode": mode, "sweep": {"dir": str(sweep)},
                                       "runtime": {"output_dir": str(job_dir)}},
                             "trainer": {"output_dir": str(job_dir)}})


def test_callback_records_a_failed_job_and_refreshes_the_summary(tmp_path):
    sweep = tmp_path / "sweep"
    job_dir = _job(sweep, 0, ["algo.lr=0"])
    cb = SweepReportCallback()
    cfg = _hydra_cfg(sweep, job_dir)
    cb.on_job_start(cfg, task_function=None)
    ret = JobReturn(status=JobStatus.FAILED)
    ret.return_value = ValueError("bad\n  value")
    cb.on_job_end(cfg, ret)
    status = json.loads((job_dir / STATUS_FILE).read_text())
    assert status["status"] == "failed" and status["error"] == "ValueError: bad value"
    assert 0 <= status["wall_min"] < 1 and status["run_dir"] == str(job_dir.resolve())
    assert [(r["job"], r["status"]) for r in _rows(sweep)] == [("0", "failed")]

    # a plain run (not -m) is left alone
    other = tmp_path / "single"
    run_dir = _job(other, 0, ["algo.lr=1"])
    SweepReportCallback().on_job_end(_hydra_cfg(other, run_dir, RunMode.RUN), JobReturn(status=JobStatus.COMPLETED))
    assert not (run_dir / STATUS_FILE).exists() and not (other / "summary.csv").exists()


# ---- a real 2x2 multirun of the debug preset ----

@pytest.fixture(scope="module")
def multirun(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """algo.lr=0 fails rlfw.validation at once (before Ray starts): jobs 0 and 1 fail, 2 and 3 train."""
    sweep = tmp_path_factory.mktemp("sweep") / "multirun"
    cmd = [sys.executable, "-m", "rlfw.run", "-m", "experiment=debug", "algo.lr=0,1e-4", "env.max_turns=2,3",
           f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, WANDB_SILENT="true"))
    return sweep, proc


@pytest.mark.slow  # a real 2x2 multirun; run by .ci/run
def test_a_multirun_ends_with_a_summary_of_every_job(multirun):
    sweep, proc = multirun
    # Hydra runs every job, then re-raises the first failure: the exit status says a job failed
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "algo.lr=0.0 must be > 0" in proc.stderr
    rows = _rows(sweep)
    assert list(rows[0]) == ["job", "algo.lr", "env.max_turns", *COLUMNS]
    assert [(r["job"], r["algo.lr"], r["env.max_turns"], r["status"]) for r in rows] == [
        ("0", "0", "2", "failed"), ("1", "0", "3", "failed"), ("2", "0.0001", "2", "ok"), ("3", "0.0001", "3", "ok")]
    for r in rows[:2]:
        assert "ConfigError" in r["error"] and "algo.lr=0.0 must be > 0" in r["error"]
        assert r["final_pass_at_1"] == "" and r["steps"] == "0" and float(r["wall_min"]) < 0.5
    for r in rows[2:]:
        assert r["steps"] == "2" and r["error"] == "" and float(r["wall_min"]) > 0
        assert 0 <= float(r["best_pass_at_1"]) <= 1 and 0 <= float(r["final_pass_at_1"]) <= float(r["best_pass_at_1"])
        metrics = [json.loads(line) for line in (sweep / r["dir"] / "metrics.jsonl").read_text().splitlines()]
        assert float(r["final_pass_at_1"]) == pytest.approx(
            [m for m in metrics if "eval/all/pass_at_1" in m][-1]["eval/all/pass_at_1"], abs=1e-4)
    assert "4 jobs: 2 ok, 2 failed" in (sweep / "summary.md").read_text()
    assert (sweep / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # run by .ci/run
def test_rlfw_report_rebuilds_the_summary_from_the_folders(multirun):
    sweep, _ = multirun
    before = {n: (sweep / n).read_bytes() for n in ("summary.csv", "summary.md")}
    for n in ("summary.csv", "summary.md", "summary.png"):
        (sweep / n).unlink()
    proc = subprocess.run([sys.executable, "-m", "rlfw.report", str(sweep)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {n: (sweep / n).read_bytes() for n in before} == before
    assert (sweep / "summary.png").exists()


# ---- the objective a job returns; Optuna's search space; parallel jobs' threads ----

def _config(*overrides: str) -> Config:
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=["trainer.output_dir=/tmp/x", *overrides]))


def test_the_objective_is_the_named_metric_and_a_missing_one_fails_in_a_multirun():
    final = {"eval/all/pass_at_1": 0.25, "train/reward_mean": 0.5}
    assert objective(final, "eval/all/pass_at_1", required=True) == 0.25
    assert objective(final, "train/reward_mean", required=True) == 0.5
    assert objective(final, None, required=True) is None
    assert objective(final, "eval/heldout/pass_at_1", required=False) is None  # a single run returns nothing
    with pytest.raises(LookupError, match=r"sweep.objective=eval/heldout/pass_at_1 was never logged.*"
                                          r"logged metrics: eval/all/pass_at_1, train/reward_mean"):
        objective(final, "eval/heldout/pass_at_1", required=True)
    cfg = _config("trainer.eval_interval=0")
    with pytest.raises(ConfigError, match="trainer.eval_interval=0 never evaluates"):
        check_objective(cfg)
    cfg.sweep.objective = "train/reward_mean"
    check_objective(cfg)  # not an evaluation metric: logged every step


def test_parallel_jobs_that_oversubscribe_the_cores_are_warned_about():
    cfg = _config("cluster.torch_threads=2")
    cores = os.cpu_count()
    assert oversubscription(cfg, 1) is None
    note = oversubscription(cfg, cores)
    assert f"up to {cores} jobs" in note and f"cluster.torch_threads={max(1, cores // cores)}" in note
    cfg.cluster.torch_threads = 1
    assert oversubscription(cfg, cores) is None


def test_swept_keys_include_a_presets_search_space(tmp_path):
    """Optuna's space lives in hydra.sweeper.params, not on the command line."""
    OmegaConf.save(OmegaConf.create({"hydra": {
        "sweeper": {"params": {"algo.n_samples_per_prompt": "choice(2, 4)", "algo.lr": "tag(log, interval(1e-5, 1e-3))",
                               "seed": "0"}},
        "overrides": {"task": ["experiment=sweep_optuna_debug", "env.max_turns=2,3", "algo.lr=1e-4"]}}}),
        tmp_path / "multirun.yaml")
    assert swept_keys(tmp_path, []) == ["algo.n_samples_per_prompt", "algo.lr", "env.max_turns"]


def _sweep(sweep: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlfw.run", "-m", *overrides, f"hydra.sweep.dir={sweep}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, WANDB_SILENT="true"))


def test_failed_trials_do_not_end_an_optuna_study(tmp_path):
    """Both trials fail before training (an evaluation objective without evaluations); the study runs
    the second after the first fails, and only ends in error because no trial completed."""
    sweep = tmp_path / "study"
    proc = _sweep(sweep, "experiment=sweep_optuna_debug", "trainer.eval_interval=0", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "No trials are completed yet" in out, out[-3000:]
    assert out.count("Failed experiment") == 2
    rows = _rows(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "failed"), ("1", "failed")]
    assert all("sweep.objective=eval/all/pass_at_1" in r["error"] for r in rows)
    assert list(rows[0])[1:4] == ["algo.n_samples_per_prompt", "env.max_turns", "algo.lr"]
    assert not (sweep / "optimization_results.yaml").exists()


@pytest.mark.slow  # two real debug trials, one after the other (103 s here); run by .ci/run
def test_an_optuna_study_writes_its_best_params_and_a_row_per_trial(tmp_path):
    sweep = tmp_path / "study"
    proc = _sweep(sweep, "experiment=sweep_optuna_debug")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    results = OmegaConf.to_container(OmegaConf.load(sweep / "optimization_results.yaml"))
    best = results["best_params"]
    assert set(best) == {"algo.n_samples_per_prompt", "env.max_turns", "algo.lr"}
    assert best["algo.n_samples_per_prompt"] in (2, 4) and best["env.max_turns"] in (2, 3)
    assert 1e-5 <= best["algo.lr"] <= 1e-3
    rows = _rows(sweep)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok")]
    assert list(rows[0])[1:4] == ["algo.n_samples_per_prompt", "env.max_turns", "algo.lr"]
    # the value Optuna maximized is what the best trial returned: its last eval/all/pass_at_1
    chosen = [r for r in rows if r["algo.lr"] == str(best["algo.lr"])]
    assert len(chosen) == 1 and float(chosen[0]["final_pass_at_1"]) == pytest.approx(results["best_value"], abs=1e-4)
    assert "Optuna study (`optimization_results.yaml`): best value" in (sweep / "summary.md").read_text()


@pytest.mark.slow  # two real debug jobs at once (55-130 s here, with other work beside it); run by .ci/run
def test_a_joblib_multirun_runs_jobs_at_once_and_writes_one_summary(tmp_path):
    """Hydra pickles the callback into each job's process (loky): each job writes its own
    job_status.json and a summary; the parent writes the last summary at the end."""
    sweep = tmp_path / "multirun"
    proc = _sweep(sweep, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "experiment=debug", "seed=0,1",
                  "cluster.torch_threads=1")  # 2 jobs x 1 thread on 2 cores (rlfw.run warns when oversubscribed)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = _rows(sweep)
    assert [(r["job"], r["seed"], r["status"], r["steps"]) for r in rows] == [("0", "0", "ok", "2"),
                                                                              ("1", "1", "ok", "2")]
    assert proc.stdout.count("rlfw: sweep summary (2 jobs)") == 3  # after each job, in its process; at the end
    spans = []
    for r in rows:
        assert json.loads((sweep / r["dir"] / STATUS_FILE).read_text())["status"] == "ok"
        stamps = [line[:19] for line in (sweep / r["dir"] / "run.log").read_text().splitlines() if line[:4].isdigit()]
        spans.append((min(stamps), max(stamps)))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # they overlapped
