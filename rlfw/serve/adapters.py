"""Adapters in the layout Ray Serve LLM loads, and a loopback S3 server for a local adapters folder.

Layout: `<prefix>/<name>/adapter_config.json` + `adapter_model.safetensors` (what rlfw.run writes
to `exports/global_step_N/` and `lora_sync/vN/`, minus the processor files). A request for
`model="<base id>:<name>"` loads `<prefix>/<name>/`. `export_adapter` writes that layout to any
fsspec URL, with `base_model_name_or_path` set to the served base id instead of the training
machine's absolute path.

Ray Serve LLM reads adapters only from remote storage (s3://, gs://, abfss://, azure://: its
`LoraConfig` validator and its download code know no local paths). For a local folder,
`LoopbackS3` starts an S3 server on 127.0.0.1 (moto's, in this process), uploads the folder's
adapters to a bucket, and gives the environment that points boto3 (Ray's S3 reader) at it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ADAPTER_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
REMOTE_SCHEMES = ("s3://", "gs://", "abfss://", "azure://")


def is_remote(path: str) -> bool:
    return path.startswith(REMOTE_SCHEMES)


def local_adapters(folder: str | Path) -> dict[str, dict]:
    """{adapter name: its adapter_config.json} for every `<folder>/<name>/adapter_config.json`."""
    out = {}
    for cfg in sorted(Path(folder).glob("*/adapter_config.json")):
        out[cfg.parent.name] = json.loads(cfg.read_text())
    return out


def safe_adapter_name(name: str) -> bool:
    """1-128 characters of [A-Za-z0-9._-], no leading '.', no '..': never a path step or a shell word."""
    return bool(ADAPTER_NAME.fullmatch(name)) and ".." not in name and not name.startswith(".")


def check_adapter_name(name: str) -> None:
    if not safe_adapter_name(name):
        raise ValueError(f"adapter name {name!r}: use 1-128 characters of [A-Za-z0-9._-], not starting with '.' "
                         "and without '..' (the server refuses other names)")


def export_adapter(src: str | Path, dst_prefix: str, name: str, base_id: str,
                   storage_options: dict | None = None) -> str:
    """Copy the PEFT adapter at `src` to `<dst_prefix>/<name>/` (local folder or fsspec URL), its
    base referenced as `base_id`. Returns the destination."""
    import fsspec

    check_adapter_name(name)
    src = Path(src)
    config = src / "adapter_config.json"
    if not config.exists():
        raise ValueError(f"{src} holds no adapter_config.json: not a PEFT adapter folder (rlfw.run writes them to "
                         "<run>/exports/global_step_N/ and <run>/lora_sync/vN/)")
    weights = [f for f in ADAPTER_FILES[1:] if (src / f).exists()]
    if not weights:
        raise ValueError(f"{src} holds no adapter_model.safetensors")
    info = json.loads(config.read_text())
    info["base_model_name_or_path"] = base_id  # portable: the served id, not this machine's path
    dst = f"{dst_prefix.rstrip('/')}/{name}"
    fs, root = fsspec.core.url_to_fs(dst, **(storage_options or {}))
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root}/{weights[0]}", "wb") as f:
        f.write((src / weights[0]).read_bytes())
    with fs.open(f"{root}/adapter_config.json", "w") as f:  # last: a folder with a config is complete
        f.write(json.dumps(info, indent=2))
    return dst


class LoopbackS3:
    """An S3 server on 127.0.0.1 holding a local adapters folder, for Ray Serve LLM to read."""

    BUCKET = "rlfw-adapters"
    PREFIX = "lora"

    def __init__(self, folder: str | Path):
        import socket

        from moto.server import ThreadedMotoServer

        self.folder = Path(folder)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What Ray's S3 reader (boto3) needs to find this server: set for every Ray worker."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint,
                "AWS_ACCESS_KEY_ID": "rlfw-loopback", "AWS_SECRET_ACCESS_KEY": "rlfw-loopback",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}

    @property
    def url(self) -> str:
        return f"s3://{self.BUCKET}/{self.PREFIX}"

    def start(self) -> "LoopbackS3":
        import boto3

        self.server.start()
        s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="rlfw-loopback",
                          aws_secret_access_key="rlfw-loopback", region_name="us-east-1")
        s3.create_bucket(Bucket=self.BUCKET)
        for name in local_adapters(self.folder):
            self.upload(s3, name)
        return self

    def upload(self, s3, name: str) -> None:
        check_adapter_name(name)
        src = self.folder / name
        for f in sorted(src.iterdir()):
            if f.is_file() and re.fullmatch(r"adapter_.*|.*\.safetensors|.*\.json", f.name):
                s3.upload_file(str(f), self.BUCKET, f"{self.PREFIX}/{name}/{f.name}")

    def stop(self) -> None:
        self.server.stop()
