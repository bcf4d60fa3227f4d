"""Metric logging: console progress bar, metrics.jsonl, TensorBoard and wandb behind one object.

Backends that are switched off are simply absent from `self.sinks`, so the training loop calls
`log(step, metrics)` without any `if wandb` branches. Metric names are namespaced
(`train/`, `eval/`, `timing/`, `policy/`). `log_images(step, {tag: file})` sends pictures (PNG, or
GIF shown animated) to TensorBoard and wandb; the console and metrics.jsonl skip them.

Messages that matter (resume notices, config-change warnings, engine restarts, the resume hint)
go through `message`: to the console and, with a timestamp, to `run.log` in the run folder, as do
the warnings of the driver's `rlfw` Python logger. A metric that is not finite is logged as it is
(NaN or inf) and reported once per key in `run.log`, never dropped.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

from rlfw.config import LoggerConfig


class _Jsonl:
    def __init__(self, path: Path):
        self.path = path
        self.f = open(path, "a", buffering=1)

    def truncate_after(self, step: int) -> None:
        self.f.close()
        rows = [line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= step]
        self.path.write_text("".join(r + "\n" for r in rows))
        self.f = open(self.path, "a", buffering=1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.f.write(json.dumps({"step": step, **metrics}) + "\n")

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        """metrics.jsonl holds numbers only."""

    def close(self) -> None:
        self.f.close()


class _TensorBoard:
    def __init__(self, path: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.path = path
        self.w = SummaryWriter(str(path))

    def truncate_after(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.w.close()
        self.w = SummaryWriter(str(self.path), purge_step=step + 1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        """Each file's bytes as an image summary, as `add_video` writes its GIFs (without moviepy):
        TensorBoard's image panel shows a GIF animated."""
        from PIL import Image
        from tensorboard.compat.proto.summary_pb2 import Summary

        for tag, path in images.items():
            with Image.open(path) as im:
                width, height = im.size
            image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=path.read_bytes())
            self.w._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class _Wandb:
    def __init__(self, cfg: LoggerConfig, out_dir: Path, run_config: Any):
        import wandb
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(OmegaConf.structured(run_config), resolve=False) if run_config else None
        self.run = wandb.init(project=cfg.wandb.project, mode=cfg.wandb.mode, dir=str(out_dir), config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        import wandb

        self.run.log({tag: wandb.Video(str(p)) if p.suffix == ".gif" else wandb.Image(str(p))
                      for tag, p in images.items()}, step=step)

    def truncate_after(self, step: int) -> None:
        """wandb keeps its history; the resumed run logs into a new offline run."""

    def close(self) -> None:
        self.run.finish()


class _RayMetrics:
    """Each metric as a Ray gauge `rlfw_<name>` tagged with the run's folder name. Ray's metrics agent
    on the driver's node serves them for Prometheus (`ray start --metrics-export-port`); a gauge only
    exists once Ray runs, so metrics logged before are skipped. Export trouble (a port in use, no
    agent) is reported once and never stops training."""

    def __init__(self, run: str):
        self.run, self.gauges, self.failed = run, {}, False

    @staticmethod
    def name(key: str) -> str:
        return "rlfw_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.failed:
            return
        try:
            import ray
            from ray.util.metrics import Gauge

            if not ray.is_initialized():
                return
            for key, value in {**metrics, "step": float(step)}.items():
                if key not in self.gauges:
                    self.gauges[key] = Gauge(self.name(key), description=key, tag_keys=("run",))
                self.gauges[key].set(value, tags={"run": self.run})
        except Exception as exc:  # never let the export stop a run
            self.failed = True
            logging.getLogger("rlfw").warning("Ray metrics export off for this run: %s", exc)

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        """Gauges only."""

    def truncate_after(self, step: int) -> None:
        """A gauge holds the latest value only."""

    def close(self) -> None:
        """Ray flushes its metrics."""


RUN_LOG = "run.log"


class MetricLogger:
    def __init__(self, cfg: LoggerConfig, out_dir: Path, total_steps: int | None, run_config: Any = None):
        """total_steps: the progress bar's length; None for a run that ends on a time budget (a count and rate)."""
        self.run_log = open(Path(out_dir) / RUN_LOG, "a", buffering=1)
        self._handler = logging.StreamHandler(self.run_log)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        logging.getLogger("rlfw").addHandler(self._handler)
        self._nonfinite: set[str] = set()
        self.sinks: list = []
        if cfg.jsonl:
            self.sinks.append(_Jsonl(out_dir / "metrics.jsonl"))
        if cfg.tensorboard:
            self.sinks.append(_TensorBoard(out_dir / "tensorboard"))
        if cfg.wandb.mode != "disabled":
            self.sinks.append(_Wandb(cfg, out_dir, run_config))
        if cfg.ray_metrics:
            self.sinks.append(_RayMetrics(Path(out_dir).resolve().name))
        self.bar = None
        if cfg.console:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, desc="train", unit="step", dynamic_ncols=True)
        self.last: dict[str, float] = {}
        self.last_step = 0

    def log(self, step: int, metrics: dict[str, float]) -> None:
        metrics = {k: float(v) for k, v in metrics.items() if v is not None}
        bad = sorted(k for k, v in metrics.items() if not math.isfinite(v) and k not in self._nonfinite)
        if bad:
            self._nonfinite.update(bad)
            self.message(f"warning: step {step}: not finite: " + ", ".join(f"{k}={metrics[k]}" for k in bad))
        self.last.update(metrics)
        self.last_step = step
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        """Send image files (PNG or GIF) by tag to TensorBoard and wandb, when they are on."""
        for sink in self.sinks:
            sink.log_images(step, images)

    def truncate_after(self, step: int) -> None:
        """Drop metrics logged after `step` (a resumed run logs those steps again)."""
        for sink in self.sinks:
            sink.truncate_after(step)

    def progress(self, step: int) -> None:
        """Advance the bar to `step` and show the headline numbers."""
        if self.bar is None:
            return
        keys = {"reward": "train/reward_mean", "solved": "train/success_rate", "loss": "sft/loss",
                "pass@1": "eval/all/pass_at_1" if "eval/all/pass_at_1" in self.last else "eval/heldout/pass_at_1"}
        shown = {k: f"{self.last[v]:.3f}" for k, v in keys.items() if v in self.last}
        self.bar.set_postfix(shown, refresh=False)  # drawn once, below
        self.bar.n = step
        self.bar.refresh()

    def message(self, text: str) -> None:
        """Show `text` on the console and append it, timestamped, to the run folder's run.log."""
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)
        self.run_log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for sink in self.sinks:
            sink.close()
        logging.getLogger("rlfw").removeHandler(self._handler)
        self.run_log.close()
