"""The console progress bar and metrics.jsonl behind MetricLogger."""

import json

from rlfw.config import LoggerConfig
from rlfw.logging import MetricLogger


def _logger(tmp_path, total_steps: int, metrics: dict) -> MetricLogger:
    """A console + jsonl logger that has logged `metrics` at step 1 and drawn its bar."""
    cfg = LoggerConfig(console=True, jsonl=True, tensorboard=False)
    cfg.wandb.mode = "disabled"
    logger = MetricLogger(cfg, tmp_path, total_steps=total_steps)
    logger.log(1, metrics)
    logger.progress(1)
    return logger


def test_bar_shows_the_headline_numbers_once_per_step(tmp_path, capsys):
    metrics = {"sft/loss": 0.25, "eval/heldout/pass_at_1": 0.5, "eval/eval64/pass_at_1": 0.75}
    logger = _logger(tmp_path, 10, metrics)
    drawn = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "1/10" in line]
    logger.close()
    assert len(drawn) == 1, drawn  # one redraw per progress() call, not two
    assert "loss=0.250" in drawn[0] and "pass@1=0.500" in drawn[0]  # SFT's loss and held-out pass@1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, **metrics}]


def test_rl_runs_show_pass_at_1_over_all_evaluation_sets(tmp_path, capsys):
    logger = _logger(tmp_path, 4, {"train/reward_mean": 0.5, "eval/all/pass_at_1": 0.625,
                                   "eval/heldout/pass_at_1": 0.1})
    logger.close()
    err = capsys.readouterr().err
    assert "reward=0.500" in err and "pass@1=0.625" in err


def test_non_finite_metrics_are_kept_and_reported_once(tmp_path):
    """A NaN or inf reaches metrics.jsonl as it is, and run.log names it (once per key)."""
    logger = _logger(tmp_path, 4, {"policy/loss": float("nan"), "policy/grad_norm": 1.0})
    logger.log(2, {"policy/loss": float("nan"), "policy/kl": float("inf")})
    logger.message("resumed from somewhere (step 1)")
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["policy/loss"] != r["policy/loss"] for r in rows)  # NaN, not dropped
    assert rows[1]["policy/kl"] == float("inf")
    log = (tmp_path / "run.log").read_text().splitlines()
    assert sum("policy/loss=nan" in line for line in log) == 1
    assert any("step 2: not finite: policy/kl=inf" in line for line in log)
    assert log[-1].endswith("resumed from somewhere (step 1)")


def test_images_reach_tensorboard_and_wandb_offline(tmp_path, monkeypatch):
    """A GIF is sent as it is (TensorBoard shows it animated; wandb as a video), a PNG as an image;
    wandb runs offline and keeps the files under its run folder."""
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_SILENT", "true")
    frames = [Image.new("RGB", (256, 300), c) for c in ("white", "black")]
    frames[0].save(tmp_path / "e.gif", save_all=True, append_images=frames[1:], duration=[100, 500])
    frames[0].save(tmp_path / "plot.png")
    cfg = LoggerConfig(console=False, jsonl=True, tensorboard=True)
    cfg.wandb.mode = "offline"
    logger = MetricLogger(cfg, tmp_path, total_steps=4)
    logger.log(3, {"eval/maze/pass_at_1": 0.5})
    logger.log_images(3, {"eval/maze/episode_000": tmp_path / "e.gif", "eval/pass_at_1_plot": tmp_path / "plot.png"})
    logger.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    (gif,), (png,) = events.Images("eval/maze/episode_000"), events.Images("eval/pass_at_1_plot")
    assert gif.step == png.step == 3 and (gif.width, gif.height) == (256, 300)
    assert gif.encoded_image_string == (tmp_path / "e.gif").read_bytes()
    assert png.encoded_image_string == (tmp_path / "plot.png").read_bytes()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    media = sorted(p.relative_to(run / "files" / "media") for p in (run / "files" / "media").rglob("*.*"))
    assert [(p.parts[0], p.suffix) for p in media] == [("images", ".png"), ("videos", ".gif")], media
    assert [json.loads(r)["step"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [3]


def test_a_run_sized_by_minutes_shows_a_count_not_its_step_cap(tmp_path, capsys):
    """trainer.schedule=minutes: total_steps is only a cap, so the bar has no length (no ETA to the cap)."""
    from types import SimpleNamespace

    from rlfw.build import build_logger
    from rlfw.config import TrainerConfig

    for schedule, want in (("steps", 10000), ("minutes", None)):
        log_cfg = LoggerConfig(console=True, jsonl=False, tensorboard=False)
        log_cfg.wandb.mode = "disabled"
        trainer = TrainerConfig(schedule=schedule, max_minutes=12, total_steps=10000)
        cfg = SimpleNamespace(logger=log_cfg, trainer=trainer)  # the two groups build_logger reads
        logger = build_logger(cfg, tmp_path)
        logger.progress(159)
        logger.close()
        assert logger.bar.total == want
    err = capsys.readouterr().err
    assert "159/10000" in err and "159step" in err.replace(" ", "")

