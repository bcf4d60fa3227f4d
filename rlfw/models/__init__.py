"""Policy models: load a checkpoint (tiny_vl or a real Qwen3-VL), wrap it with LoRA."""

from __future__ import annotations

from pathlib import Path

import torch

from rlfw.models.processing import PolicyProcessor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_policy(path: str | Path, dtype: str = "float32") -> tuple[torch.nn.Module, PolicyProcessor]:
    """Load a Qwen-VL checkpoint folder (model + tokenizer + image processor) or hub id."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=DTYPES[dtype])
    return model, PolicyProcessor.from_pretrained(path)


def apply_lora(model: torch.nn.Module, rank: int, alpha: int, dropout: float, target_modules: list[str]):
    """Wrap with a PEFT LoRA adapter; rank 0 returns the model for full fine-tuning."""
    if rank == 0:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                        bias="none")
    return get_peft_model(model, config)
