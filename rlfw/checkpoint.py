"""Full training checkpoints that a killed run resumes from exactly.

Layout under `trainer.ckpt_path`:

    global_step_N/
        policy_state.pt       trainable weights (adapter or full), AdamW state, LR schedule (trainer worker)
        trainer_state.json    global step and the driver's RNG states
        config.yaml           the resolved config the checkpoint was written with
        manifest.json         size and sha256 of every file above (written last inside the folder)
    latest_checkpointed_iteration.txt   N, replaced atomically after global_step_N is complete

A step is written to `global_step_N.tmp/`, flushed, then renamed; the pointer file is replaced
last. A crash at any moment leaves the previous checkpoint valid. On resume every file is checked
against the manifest; a truncated or corrupt checkpoint is reported and skipped for the next older
valid one. Rollouts of step N are a pure function of (seed, N, weights) (see `rlfw.train`), so the
step number is the whole sampler position.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

POINTER = "latest_checkpointed_iteration.txt"
MANIFEST = "manifest.json"
POLICY_STATE = "policy_state.pt"
# Config keys whose change alters what a checkpoint's weights mean.
MEANING_KEYS = ("model",)


class CheckpointError(RuntimeError):
    pass


@dataclass
class Resumed:
    step: int
    path: Path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def preflight(ckpt_path: str | Path, need_bytes: int = 64 << 20) -> None:
    """Fail at start, not at step 20: the checkpoint folder must be writable and have room."""
    root = Path(ckpt_path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".rlfw_write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"trainer.ckpt_path={root} is not writable: {exc}") from exc
    free = shutil.disk_usage(root).free
    if free < need_bytes:
        raise CheckpointError(f"trainer.ckpt_path={root} has {free >> 20} MiB free; need at least {need_bytes >> 20} MiB")


def driver_rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state().tolist()}


def set_driver_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(root: str | Path, step: int, policy, config, max_to_keep: int) -> Path:
    """Write global_step_<step> completely, then point at it; prune to `max_to_keep` (0 keeps all)."""
    root = Path(root)
    final = root / f"global_step_{step}"
    staging = root / f"global_step_{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    policy.save_checkpoint(str(staging / POLICY_STATE))
    state = {"global_step": step, "rng": driver_rng_state()}
    (staging / "trainer_state.json").write_text(json.dumps(state, default=_json_default))
    (staging / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    files = sorted(p for p in staging.iterdir())
    for p in files:
        with open(p, "rb+") as f:
            os.fsync(f.fileno())
    manifest = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    _write_atomic(staging / MANIFEST, json.dumps(manifest, indent=1))
    _fsync_dir(staging)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    _fsync_dir(root)
    _write_atomic(root / POINTER, str(step))
    if max_to_keep > 0:
        for old in sorted(_step_dirs(root), key=lambda p: _step_of(p))[:-max_to_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _json_default(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(type(obj))


def _step_of(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[1])


def _step_dirs(root: Path) -> list[Path]:
    return [p for p in root.glob("global_step_*") if p.is_dir() and p.name.rsplit("_", 1)[1].isdigit()]


def verify(path: Path) -> str | None:
    """None if every file matches the manifest, else what is wrong."""
    manifest_file = path / MANIFEST
    if not manifest_file.exists():
        return "no manifest (incomplete write)"
    try:
        manifest = json.loads(manifest_file.read_text())
    except json.JSONDecodeError:
        return "unreadable manifest"
    for name, meta in manifest.items():
        f = path / name
        if not f.exists():
            return f"{name} is missing"
        if f.stat().st_size != meta["size"]:
            return f"{name} has {f.stat().st_size} bytes, manifest says {meta['size']}"
        if _sha256(f) != meta["sha256"]:
            return f"{name} checksum mismatch"
    return None


def find_resume(root: str | Path, log=print) -> Resumed | None:
    """The newest valid checkpoint, starting from the pointer; bad ones are reported and skipped."""
    root = Path(root)
    candidates = sorted(_step_dirs(root), key=_step_of, reverse=True)
    pointer = root / POINTER
    if pointer.exists() and pointer.read_text().strip().isdigit():
        latest = int(pointer.read_text())
        candidates = [p for p in candidates if _step_of(p) <= latest]
    for path in candidates:
        if not (path / MANIFEST).exists() and not (path / "trainer_state.json").exists() and (path / "policy").exists():
            continue  # an inference export (hf_save_interval) without a full checkpoint
        problem = verify(path)
        if problem is None:
            return Resumed(_step_of(path), path)
        log(f"checkpoint {path} is unusable ({problem}); falling back to an older one")
    return None


def check_config(path: Path, config, allow_changes: bool) -> None:
    """Refuse to resume when keys that define the weights differ, naming them."""
    saved = OmegaConf.to_container(OmegaConf.load(path / "config.yaml"), resolve=False)
    now = OmegaConf.to_container(OmegaConf.structured(config), resolve=False)
    diffs = []
    for key in MEANING_KEYS:
        diffs += _diff(saved.get(key), now.get(key), key)
    if diffs and not allow_changes:
        raise CheckpointError(
            f"the config changes what checkpoint {path} means: " + "; ".join(diffs)
            + ". Undo the change, or set trainer.resume_ignore_config_changes=true to resume anyway."
        )


def _diff(a, b, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{prefix}.{k}")]
    return [] if a == b else [f"{prefix}: checkpoint {a!r}, now {b!r}"]


def load_trainer_state(path: Path) -> dict:
    state = json.loads((path / "trainer_state.json").read_text())
    set_driver_rng_state(state["rng"])
    return state
