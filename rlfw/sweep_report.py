"""A sweep's summary: one row per job of a Hydra multirun, built from the job folders alone.

`python -m rlfw.run -m ...` ends with `summary.csv`, `summary.md` and `summary.png` in the sweep
folder (`hydra.sweep.dir`); `python -m rlfw.report <sweep folder>` rebuilds the same files. A row
holds the job's swept overrides (one column per swept key), its final and best
`eval/all/pass_at_1`, the steps it completed, its wall time and its status (`ok`, `failed` or
`unfinished`); the PNG draws every job's pass@1 against the step, coloured by the first swept key
and styled by the others.

What a job folder holds: Hydra's `.hydra/overrides.yaml` (the job's overrides) and `.hydra/hydra.yaml`
(its job number); the run's `metrics.jsonl`, `config.yaml` and `run.log`; and `job_status.json`,
written by `SweepReportCallback.on_job_end` (status, wall time, error, run folder). The swept keys
are the sweep overrides of the sweep folder's `multirun.yaml` (`hydra.sweeper.params`, then the
command line's), which the callback writes at the start for sweepers that do not (Optuna's). An
Optuna study's `optimization_results.yaml` (best params and value) is quoted in `summary.md`.

Hydra 1.3's basic sweeper runs every job of a batch even when one fails, then raises, so
`on_multirun_end` is never called for a sweep with a failed job: the callback therefore rebuilds the
summary after every job, and the files are current whenever the sweep stops. Under the joblib
launcher (`hydra/launcher=joblib`) Hydra pickles the callback into each job's process, so
`on_job_start`/`on_job_end` (the status file, a rebuild) run in the job's process and
`on_multirun_start`/`on_multirun_end` in the parent; rebuilds that overlap each replace the files
in one rename.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rlfw.report import eval_series

OBJECTIVE = "eval/all/pass_at_1"
STATUS_FILE = "job_status.json"
SUMMARY_FILES = ("summary.csv", "summary.md", "summary.png")
STOPPED = "training stopped after step"  # what rlfw.run writes to run.log when training raises


@dataclass
class JobSummary:
    """One job of a sweep, as its folder records it."""

    num: int
    """Hydra's job number (`hydra.job.num`)."""
    dir: str
    """The job folder, relative to the sweep folder."""
    overrides: dict[str, str]
    """key -> value as written on the command line (Hydra's `.hydra/overrides.yaml`)."""
    status: str
    """ok | failed | unfinished (no status recorded: still running, killed, or swept without the callback)."""
    final: float | None = None
    """The last logged eval/all/pass_at_1 (what the run returns to the sweeper under the default sweep.objective)."""
    best: float | None = None
    best_step: int | None = None
    steps: int = 0
    """The last step logged to metrics.jsonl (0: none completed)."""
    wall_min: float | None = None
    """Job wall time (job_status.json), else the run's last timing/elapsed_min."""
    error: str = ""
    curve: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    """(steps, eval/all/pass_at_1) for the plot."""


def job_dirs(sweep_dir: Path) -> list[Path]:
    """Every folder under `sweep_dir` that holds `.hydra/overrides.yaml` (not descending into them)."""
    found = []
    for root, dirs, _ in os.walk(sweep_dir):
        if Path(root) != Path(sweep_dir) and (Path(root) / ".hydra" / "overrides.yaml").exists():
            found.append(Path(root))
            dirs.clear()
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return found


def _split(line: str) -> tuple[str, str]:
    key, _, value = str(line).partition("=")
    return key.lstrip("+~"), value


def swept_keys(sweep_dir: Path, jobs: list[dict[str, str]]) -> list[str]:
    """The keys that `multirun.yaml` sweeps: those of `hydra.sweeper.params` (a preset's search space,
    Optuna's or the basic sweeper's), then the command line's, in order; without it, the keys whose
    values differ."""
    path = Path(sweep_dir) / "multirun.yaml"
    if path.exists():
        from hydra.core.override_parser.overrides_parser import OverridesParser

        conf = OmegaConf.load(path)
        params = OmegaConf.select(conf, "hydra.sweeper.params", default=None) or {}
        task = OmegaConf.select(conf, "hydra.overrides.task", default=None) or []
        try:
            parsed = OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()),
                                                               *(str(o) for o in task)])
        except Exception:  # an override this Hydra cannot parse: fall back to what differs
            parsed = None
        if parsed is not None:
            return list(dict.fromkeys(o.key_or_group for o in parsed if o.is_sweep_override()))
    keys = list(dict.fromkeys(k for job in jobs for k in job))
    return [k for k in keys if len({job.get(k) for job in jobs}) > 1]


def _job_num(job_dir: Path) -> int:
    try:
        return int(OmegaConf.select(OmegaConf.load(job_dir / ".hydra" / "hydra.yaml"), "hydra.job.num"))
    except Exception:
        match = re.match(r"\d+", job_dir.name)
        return int(match.group()) if match else -1


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_job(sweep_dir: Path, job_dir: Path) -> JobSummary:
    overrides = dict(_split(o) for o in OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")))
    recorded = json.loads((job_dir / STATUS_FILE).read_text()) if (job_dir / STATUS_FILE).exists() else {}
    run_dir = Path(recorded.get("run_dir") or job_dir)
    if not (run_dir / "metrics.jsonl").exists() and (job_dir / "metrics.jsonl").exists():
        run_dir = job_dir  # the sweep folder was moved since
    job = JobSummary(num=_job_num(job_dir), dir=job_dir.relative_to(sweep_dir).as_posix(), overrides=overrides,
                     status=recorded.get("status", "unfinished"), error=recorded.get("error", ""))
    metrics = run_dir / "metrics.jsonl"
    elapsed = None
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        job.steps = max((int(r["step"]) for r in rows), default=0)
        elapsed = next((r["timing/elapsed_min"] for r in reversed(rows) if "timing/elapsed_min" in r), None)
        job.curve = eval_series(metrics, OBJECTIVE)
        steps, values = job.curve
        if values:
            job.final = values[-1]
            best = max(range(len(values)), key=lambda i: values[i])
            job.best, job.best_step = values[best], int(steps[best])
    job.wall_min = recorded.get("wall_min", elapsed)
    if not recorded:
        job.status, job.error = _infer_status(run_dir, job.steps)
    return job


def _infer_status(run_dir: Path, steps: int) -> tuple[str, str]:
    """A job without job_status.json: failed if run.log says training stopped, ok if it reached total_steps."""
    log = run_dir / "run.log"
    if log.exists():
        stopped = [line for line in log.read_text(errors="replace").splitlines() if STOPPED in line]
        if stopped:
            return "failed", _one_line(STOPPED + stopped[-1].split(STOPPED, 1)[1])
    config = run_dir / "config.yaml"
    if config.exists():
        total = OmegaConf.select(OmegaConf.load(config), "trainer.total_steps", default=None)
        if total is not None and steps >= total:
            return "ok", ""
    return "unfinished", ""


@dataclass
class Sweep:
    dir: Path
    keys: list[str]
    """The swept keys: one column each."""
    jobs: list[JobSummary]


def summarize(sweep_dir: str | Path) -> Sweep:
    """Read every job folder of a sweep (a pure function of the folders)."""
    sweep_dir = Path(sweep_dir)
    jobs = sorted((read_job(sweep_dir, d) for d in job_dirs(sweep_dir)), key=lambda j: (j.num, j.dir))
    return Sweep(sweep_dir, swept_keys(sweep_dir, [j.overrides for j in jobs]), jobs)


def _fmt(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


COLUMNS = ["status", "final_pass_at_1", "best_pass_at_1", "best_step", "steps", "wall_min", "dir", "error"]


def _cells(job: JobSummary) -> list[str]:
    return [job.status, _fmt(job.final, 4), _fmt(job.best, 4), "" if job.best_step is None else str(job.best_step),
            str(job.steps), _fmt(job.wall_min, 2), job.dir, job.error]


def to_csv(sweep: Sweep) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["job", *sweep.keys, *COLUMNS])
    for job in sweep.jobs:
        w.writerow([job.num, *(job.overrides.get(k, "") for k in sweep.keys), *_cells(job)])
    return buf.getvalue()


def to_markdown(sweep: Sweep) -> str:
    counts = {s: sum(j.status == s for j in sweep.jobs) for s in ("ok", "failed", "unfinished")}
    lines = [f"# Sweep {sweep.dir.resolve().name}", "",
             f"{len(sweep.jobs)} jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ". "
             f"Swept: {', '.join(f'`{k}`' for k in sweep.keys) or 'nothing'}. "
             f"pass@1 is `{OBJECTIVE}` (final: last evaluation; best: highest, at its step).", ""]
    study = sweep.dir / "optimization_results.yaml"
    if study.exists():
        results = OmegaConf.to_container(OmegaConf.load(study))
        if "best_params" in results:
            lines += [f"Optuna study (`{study.name}`): best value {results.get('best_value')} with "
                      + ", ".join(f"{k}={v}" for k, v in results["best_params"].items()) + ".", ""]
    scored = [j for j in sweep.jobs if j.status == "ok" and j.final is not None]
    if scored:
        top = max(scored, key=lambda j: j.final)
        lines += [f"Best final pass@1: {top.final:.3f}, job {top.num} ("
                  + (", ".join(f"{k}={top.overrides.get(k, '')}" for k in sweep.keys) or top.dir) + ").", ""]
    head = ["job", *sweep.keys, *COLUMNS]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if h in {"job", "final_pass_at_1",
              "best_pass_at_1", "best_step", "steps", "wall_min"} else "---" for h in head) + "|"]
    for job in sweep.jobs:
        cells = [str(job.num), *(job.overrides.get(k, "") for k in sweep.keys), *_cells(job)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "![pass@1 per job](summary.png)", ""]
    return "\n".join(lines)


def plot_sweep(sweep: Sweep, out: Path) -> Path:
    """eval/all/pass_at_1 against the step, one line per job: colour by the first swept key's value,
    line style and marker by the other keys' values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    first, rest = (sweep.keys[0], sweep.keys[1:]) if sweep.keys else (None, [])
    colours = list(dict.fromkeys(j.overrides.get(first, "") for j in sweep.jobs))
    styles = list(dict.fromkeys(tuple(j.overrides.get(k, "") for k in rest) for j in sweep.jobs))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D", "v", "x"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for job in sweep.jobs:
        steps, values = job.curve
        if not steps:
            continue
        c = colours.index(job.overrides.get(first, ""))
        s = styles.index(tuple(job.overrides.get(k, "") for k in rest))
        label = ", ".join(f"{k}={job.overrides.get(k, '')}" for k in sweep.keys) or job.dir
        ax.plot(steps, values, color=cycle[c % len(cycle)], linestyle=lines[s % len(lines)],
                marker=markers[s % len(markers)], label=f"{label} ({job.status})" if job.status != "ok" else label)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel(f"greedy pass@1 ({OBJECTIVE})")
    ax.set_ylim(-0.02, 1.02)
    missing = sum(not j.curve[0] for j in sweep.jobs)
    ax.set_title(f"sweep {sweep.dir.resolve().name}: {len(sweep.jobs)} jobs"
                 + (f" ({missing} without an evaluation, not drawn)" if missing else ""), fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return out


def _write(path: Path, text: str) -> None:
    """Replace `path` in one rename (jobs of a parallel launcher may rebuild the summary at once)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_summary(sweep_dir: str | Path) -> Sweep:
    """Write summary.csv, summary.md and summary.png into the sweep folder, from its job folders alone."""
    sweep = summarize(sweep_dir)
    _write(sweep.dir / "summary.csv", to_csv(sweep))
    _write(sweep.dir / "summary.md", to_markdown(sweep))
    fd, tmp = tempfile.mkstemp(dir=sweep.dir, prefix=".summary.png.", suffix=".png")
    os.close(fd)
    os.replace(plot_sweep(sweep, Path(tmp)), sweep.dir / "summary.png")
    return sweep


def is_sweep_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / "multirun.yaml").exists() or (path.is_dir() and bool(job_dirs(path)))


class SweepReportCallback(Callback):
    """Registered in conf/config.yaml (`hydra.callbacks.sweep_report`); acts in multirun mode only.

    After every job: writes the job's `job_status.json` and rebuilds the sweep summary; at the end of
    the multirun (when Hydra gets there: not after a failed job, see the module docstring), again."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}

    @staticmethod
    def _multirun(config: DictConfig) -> bool:
        from hydra.types import RunMode

        return OmegaConf.select(config, "hydra.mode", default=None) == RunMode.MULTIRUN

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Save the sweep's config as `multirun.yaml`, which Hydra's basic sweeper then rewrites the same
        and Optuna's never writes: the summary reads the swept keys from it."""
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(config, sweep_dir / "multirun.yaml")

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self._multirun(config):
            self._started[str(config.hydra.runtime.output_dir)] = time.perf_counter()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not self._multirun(config):
            return
        from hydra.core.utils import JobStatus

        job_dir = Path(str(config.hydra.runtime.output_dir))
        started = self._started.pop(str(job_dir), None)
        status = {"status": "ok" if job_return.status == JobStatus.COMPLETED else "failed", "error": ""}
        if job_return.status != JobStatus.COMPLETED:
            try:
                job_return.return_value  # re-raises the job's exception
            except Exception as exc:
                status["error"] = _one_line(f"{type(exc).__name__}: {exc}")
        if started is not None:
            status["wall_min"] = round((time.perf_counter() - started) / 60, 4)
        run_dir = OmegaConf.select(config, "trainer.output_dir", default=None, throw_on_resolution_failure=False)
        status["run_dir"] = str(Path(str(run_dir or job_dir)).resolve())
        job_dir.mkdir(parents=True, exist_ok=True)
        _write(job_dir / STATUS_FILE, json.dumps(status, indent=1) + "\n")
        self._refresh(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._refresh(config)

    @staticmethod
    def _refresh(config: DictConfig) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            sweep = write_summary(sweep_dir)
        except Exception as exc:  # a report must never be what fails a sweep
            print(f"rlfw: could not write the sweep summary in {sweep_dir}: {type(exc).__name__}: {exc}", flush=True)
            return
        print(f"rlfw: sweep summary ({len(sweep.jobs)} jobs) in {sweep_dir / 'summary.md'}", flush=True)
