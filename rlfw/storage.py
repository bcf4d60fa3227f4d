"""Crash-safe writes on local disk or any fsspec filesystem: a folder or a file appears whole or not at all.

Every artefact rlfw publishes (synced adapters, checkpoints, inference exports, SFT checkpoints,
pointer files) goes through these two helpers:

    with atomic_dir(fs, "runs/x/lora_sync/v3") as staging:   # fill `staging`, then it is moved into place
        model.save_pretrained(staging)
    atomic_write(fs, "runs/x/lora_sync/LATEST", b"3")

On local disk the final step is a rename, so a reader sees the old folder or the new one, never a
mix; on object stores a folder is copied object by object and only then is the source deleted,
and a pointer file written last is what tells readers the folder is complete.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from typing import Iterator

from fsspec.implementations.local import LocalFileSystem

LOCAL = LocalFileSystem()


def is_local(fs) -> bool:
    return isinstance(fs, LocalFileSystem)


def write_file(fs, path: str, data: bytes) -> dict:
    """Write `data` durably (fsync on local disk); return its manifest entry (size, sha256)."""
    with fs.open(path, "wb") as f:
        f.write(data)
        if is_local(fs):
            f.flush()
            os.fsync(f.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def save_state(url: str, state: dict, storage_options: dict | None = None) -> dict:
    """`torch.save` a state dict to `url` (any fsspec URL), durably; return its manifest entry."""
    import io

    import fsspec
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return write_file(fs, path, buf.getvalue())


def load_state(url: str, storage_options: dict | None = None) -> dict:
    """What `save_state` wrote, on the CPU (tensors and plain values only: `weights_only`)."""
    import io

    import fsspec
    import torch

    with fsspec.open(url, "rb", **dict(storage_options or {})) as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)


def atomic_write(fs, path: str, data: bytes) -> dict:
    """Replace the file at `path` with `data` in one step (a rename locally; one PUT on object stores)."""
    head, tail = path.rsplit("/", 1) if "/" in path else ("", path)
    tmp = f"{head}/.{tail}.tmp" if head else f".{tail}.tmp"
    entry = write_file(fs, tmp, data)
    fs.mv(tmp, path)
    return entry


def move_dir(fs, src: str, dst: str) -> None:
    """A rename on local disk; on object stores, copy every object then delete the source."""
    if is_local(fs):
        os.replace(src, dst)
        return
    fs.invalidate_cache()
    for f in fs.find(src):
        fs.copy(f, dst + f[len(src):])
    fs.rm(src, recursive=True)
    fs.invalidate_cache()


@contextmanager
def atomic_dir(fs, path: str) -> Iterator[str]:
    """Yield `<path>.tmp` (emptied first) to fill; on success it replaces `path` whole. On an
    exception the staging folder is left behind and `path` is untouched."""
    path = path.rstrip("/")
    staging = path + ".tmp"
    if fs.exists(staging):
        fs.rm(staging, recursive=True)
    fs.makedirs(staging, exist_ok=True)
    yield staging
    if fs.exists(path):
        fs.rm(path, recursive=True)
    move_dir(fs, staging, path)


@contextmanager
def local_dir_for(fs, staging: str) -> Iterator[str]:
    """A local folder whose files end up in `staging` on `fs`: `staging` itself on local disk,
    else a temporary folder uploaded on exit (for writers such as `save_pretrained` that need a path)."""
    if is_local(fs):
        yield staging
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield tmp
        for root, _, files in os.walk(tmp):
            for name in files:
                local = os.path.join(root, name)
                fs.put_file(local, f"{staging}/{os.path.relpath(local, tmp)}")
