"""Hand trained weights from the trainer to the rollout engines through shared storage.

After each training step the trainer writes `<sync_root>/v<N>/` (a PEFT adapter folder:
`adapter_config.json` + `adapter_model.safetensors`, or a full `save_pretrained` folder when
training without LoRA), then atomically replaces `<sync_root>/LATEST` with `N`. An engine reads
`LATEST` and loads that version, so it never sees a half-written folder. vLLM loads the same
adapter folder as a `LoRARequest`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlfw.storage import LOCAL, atomic_dir, atomic_write

KEEP_VERSIONS = 2


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def save_policy_weights(model: torch.nn.Module, sync_root: str | Path, version: int,
                        state_dict: dict | None = None) -> Path:
    """Write version `version` of the trainable weights and point LATEST at it (`state_dict`: the
    weights gathered from sharded training ranks, else the model's own)."""
    root = Path(sync_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{version}"
    with atomic_dir(LOCAL, str(final)) as staging:
        model.save_pretrained(staging, **({"state_dict": state_dict} if state_dict is not None else {}))
    atomic_write(LOCAL, str(root / "LATEST"), str(version).encode())
    for old in root.glob("v*"):
        if old.name[1:].isdigit() and int(old.name[1:]) <= version - KEEP_VERSIONS:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_version(sync_root: str | Path) -> int:
    pointer = Path(sync_root) / "LATEST"
    if not pointer.exists():
        raise FileNotFoundError(f"no weights published under {sync_root} (missing LATEST)")
    return int(pointer.read_text())


def load_policy_weights(model: torch.nn.Module, sync_root: str | Path) -> int:
    """Load the latest published weights into `model` in place; return their version."""
    version = latest_version(sync_root)
    folder = Path(sync_root) / f"v{version}"
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        state = load_file(str(folder / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"adapter at {folder} does not match the engine's model: {unexpected[:3]} ...")
    else:
        state = {}
        for shard in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(shard)))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise RuntimeError(f"weights at {folder} do not match the engine's model: {unexpected[:3]} ...")
    return version
