"""Full training checkpoints that a killed run resumes from exactly, on local disk or through fsspec.

Layout under `trainer.ckpt_path` (a folder, or a URI such as `s3://bucket/run`):

    global_step_N/
        policy_state.pt       trainable weights (adapter or full), AdamW state, LR schedule (trainer worker)
        trainer_state.json    global step, the driver's RNG states and the loop's own state (restart buffer)
        config.yaml           the resolved config the checkpoint was written with
        manifest.json         size and sha256 of every file above (written last inside the folder)
    latest_checkpointed_iteration.txt   N, replaced after global_step_N is complete

Inference exports (`trainer.hf_save_interval`) are kept apart, under `trainer.export_path`
(`ExportStore`), so pruning old checkpoints never deletes them.

A step is written to `global_step_N.tmp/`, flushed, then moved into place (a rename on local disk);
the pointer file is written last. A crash at any moment leaves the previous checkpoint valid. On
resume every file is checked against the manifest; a truncated or corrupt checkpoint is reported and
skipped for the next older valid one. Rollouts of step N are a pure function of (seed, N, weights)
(see `rlfw.train`) and, with restarts, of the restart buffer, which trainer_state.json holds; so the
step number and that buffer are the whole sampler position.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass

import fsspec
import numpy as np
import torch
from omegaconf import OmegaConf

from rlfw.storage import atomic_dir, atomic_write, is_local, write_file

POINTER = "latest_checkpointed_iteration.txt"
MANIFEST = "manifest.json"
POLICY_STATE = "policy_state.pt"
# Config keys whose change alters what a checkpoint's weights mean (refused), and keys whose change
# alters how training continues (reported).
MEANING_KEYS = ("model",)
CONTINUATION_KEYS = ("algo", "env", "seed", "trainer.total_steps")


class CheckpointError(RuntimeError):
    pass


@dataclass
class Resumed:
    step: int
    path: str  # inside the store's filesystem


def driver_rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state().tolist()}


def set_driver_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def _json_default(obj):
    if isinstance(obj, (np.ndarray, tuple)):
        return list(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(type(obj))


def _step_of(name: str) -> int | None:
    tail = name.rstrip("/").rsplit("/", 1)[-1]
    if tail.startswith("global_step_") and tail[len("global_step_"):].isdigit():
        return int(tail[len("global_step_"):])
    return None


def preflight(url: str, storage_options: dict | None = None, key: str = "trainer.ckpt_path") -> None:
    """Fail at start, not at step 20: the location `key` names must accept a write (and have room, locally)."""
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    probe = root.rstrip("/") + "/.rlfw_write_probe"
    try:
        fs.makedirs(root, exist_ok=True)
        write_file(fs, probe, b"ok")
        fs.rm(probe)
    except OSError as exc:
        raise CheckpointError(f"{key}={url} is not writable: {exc}") from exc
    if is_local(fs):
        import shutil

        free = shutil.disk_usage(root).free
        if free < 64 << 20:
            raise CheckpointError(f"{key}={url} has {free >> 20} MiB free; need at least 64 MiB")


class CheckpointStore:
    """Checkpoints under one folder or URI (`storage_options` go to fsspec, e.g. an S3 endpoint)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = fsspec.core.url_to_fs(url, **self.storage_options)
        self.root = self.root.rstrip("/")

    def _p(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def url_of(self, path: str) -> str:
        """A URL another process (the trainer worker) can open with fsspec."""
        return self.fs.unstrip_protocol(path)

    def save(self, step: int, policy, config, max_to_keep: int, elapsed_min: float = 0.0,
             loop_state: dict | None = None) -> str:
        """Write global_step_<step> completely, then point at it; prune to `max_to_keep` (0 keeps all).
        `elapsed_min` (the run's wall time so far) goes into the trainer state for a resume to count on from,
        and so does `loop_state` (JSON-able; the training loop's restart buffer), merged in at the top level."""
        fs, final = self.fs, self._p(f"global_step_{step}")
        with atomic_dir(fs, final) as staging:
            manifest = {POLICY_STATE: policy.save_checkpoint(self.url_of(f"{staging}/{POLICY_STATE}"),
                                                             self.storage_options)}
            state = {**(loop_state or {}), "global_step": step, "elapsed_min": elapsed_min, "rng": driver_rng_state()}
            manifest["trainer_state.json"] = write_file(fs, f"{staging}/trainer_state.json",
                                                        json.dumps(state, default=_json_default).encode())
            manifest["config.yaml"] = write_file(fs, f"{staging}/config.yaml",
                                                 OmegaConf.to_yaml(OmegaConf.structured(config)).encode())
            write_file(fs, f"{staging}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
        atomic_write(fs, self._p(POINTER), str(step).encode())
        # Folders above this step belong to a future abandoned by a resume from an older step.
        complete = [p for p in self._step_dirs() if fs.exists(f"{p}/{MANIFEST}")]
        for stale in [p for p in self._step_dirs() if _step_of(p) > step]:
            fs.rm(stale, recursive=True)
        _prune(fs, [p for p in complete if _step_of(p) <= step], max_to_keep)
        return final

    def _step_dirs(self) -> list[str]:
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return []
        return [p for p in self.fs.ls(self.root, detail=False) if _step_of(p) is not None and self.fs.isdir(p)]

    def verify(self, path: str) -> str | None:
        """None if every file matches the manifest, else what is wrong."""
        fs = self.fs
        try:
            manifest = json.loads(fs.cat(f"{path}/{MANIFEST}"))
        except FileNotFoundError:
            return "no manifest (incomplete write)"
        except json.JSONDecodeError:
            return "unreadable manifest"
        for name, meta in manifest.items():
            f = f"{path}/{name}"
            if not fs.exists(f):
                return f"{name} is missing"
            size = fs.size(f)
            if size != meta["size"]:
                return f"{name} has {size} bytes, manifest says {meta['size']}"
            if hashlib.sha256(fs.cat(f)).hexdigest() != meta["sha256"]:
                return f"{name} checksum mismatch"
        return None

    def find_resume(self, log=print) -> Resumed | None:
        """The newest valid checkpoint at or before the pointer; bad ones are reported and skipped."""
        candidates = sorted(self._step_dirs(), key=_step_of, reverse=True)
        pointer = self._p(POINTER)
        if self.fs.exists(pointer):
            text = self.fs.cat(pointer).decode().strip()
            if text.isdigit():
                candidates = [p for p in candidates if _step_of(p) <= int(text)]
        for path in candidates:
            problem = self.verify(path)
            if problem is None:
                return Resumed(_step_of(path), path)
            log(f"checkpoint {self.url_of(path)} is unusable ({problem}); falling back to an older one")
        return None

    def resolve(self, url: str) -> Resumed:
        """A checkpoint named by the user (resume_mode=from_path), verified."""
        _, path = fsspec.core.url_to_fs(url, **self.storage_options)
        path = path.rstrip("/")
        step = _step_of(path)
        if step is None:
            raise CheckpointError(f"trainer.resume_path={url} is not a global_step_N folder")
        problem = self.verify(path)
        if problem:
            raise CheckpointError(f"cannot resume from {url}: {problem}")
        return Resumed(step, path)

    def check_config(self, path: str, config, allow_changes: bool, continuation_keys=CONTINUATION_KEYS,
                     way_out: str = "set trainer.resume_ignore_config_changes=true to resume anyway") -> list[str]:
        """Refuse to resume when keys that define the weights differ, naming them (`way_out`: what the
        user can do instead of undoing the change); return the differences under `continuation_keys`,
        which change how training continues (the caller reports them)."""
        saved = OmegaConf.to_container(OmegaConf.create(self.fs.cat(f"{path}/config.yaml").decode()), resolve=False)
        now = OmegaConf.to_container(OmegaConf.structured(config), resolve=False)
        diffs = [d for key in MEANING_KEYS for d in _diff(_get(saved, key), _get(now, key), key)]
        if diffs and not allow_changes:
            raise CheckpointError(
                f"the config changes what checkpoint {self.url_of(path)} means: " + "; ".join(diffs)
                + f". Undo the change, or {way_out}."
            )
        return diffs + [d for key in continuation_keys for d in _diff(_get(saved, key), _get(now, key), key)]

    def load_trainer_state(self, path: str) -> dict:
        state = json.loads(self.fs.cat(f"{path}/trainer_state.json"))
        set_driver_rng_state(state["rng"])
        return state


def load_resumed(store: CheckpointStore, found: Resumed, config, policy, logger, allow_changes: bool = False,
                 **check) -> dict:
    """Load checkpoint `found` into `policy` (its `load_checkpoint`) and the driver's RNG, after
    `store.check_config` (`check`: its keyword arguments) has refused a change to what the weights
    mean or returned the changes to report; drop the metrics `logger` holds after its step (they are
    logged again); return its trainer state."""
    for change in store.check_config(found.path, config, allow_changes, **check):
        logger.message(f"warning: resuming with a changed setting: {change}")
    policy.load_checkpoint(store.url_of(f"{found.path}/{POLICY_STATE}"), store.storage_options)
    state = store.load_trainer_state(found.path)
    logger.truncate_after(found.step)
    logger.message(f"resumed from {store.url_of(found.path)} (step {found.step})")
    return state


class ExportStore:
    """Inference-ready policies (PEFT adapter or full model, plus processor) under `trainer.export_path`:

        global_step_N/   adapter_config.json, adapter_model.safetensors (or model weights), processor files

    Each folder is a model (or adapter) folder that `model.path=`, PEFT and a LoRA server load as it
    is, named so that the folder name can serve as the adapter's name. Exports live apart from the
    full checkpoints, so pruning checkpoints never deletes one; `trainer.max_exports_to_keep`
    prunes them on its own (0 keeps all).
    """

    def __init__(self, url: str, storage_options: dict | None = None):
        self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self.root = self.root.rstrip("/")
        self.storage_options = dict(storage_options or {})

    def save(self, step: int, policy, max_to_keep: int) -> str:
        path = f"{self.root}/global_step_{step}"
        policy.export_pretrained(self.fs.unstrip_protocol(path), self.storage_options)
        self.fs.invalidate_cache()
        _prune(self.fs, [p for p in self.fs.ls(self.root, detail=False) if _step_of(p) is not None], max_to_keep)
        return path


def _prune(fs, step_dirs: list[str], keep: int) -> None:
    """Delete all but the `keep` newest global_step_N folders of `step_dirs` (0 keeps all)."""
    if keep > 0:
        for old in sorted(step_dirs, key=_step_of)[:-keep]:
            fs.rm(old, recursive=True)


def _get(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _diff(a, b, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{prefix}.{k}")]
    return [] if a == b else [f"{prefix}: checkpoint {a!r}, now {b!r}"]
