"""Policy models: load a checkpoint (tiny_vl or a real Qwen3-VL), wrap it with LoRA."""

from __future__ import annotations

from pathlib import Path

import torch

from rlfw.models.processing import PolicyProcessor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_policy(path: str | Path, dtype: str = "float32",
                attn_implementation: str | None = None) -> tuple[torch.nn.Module, PolicyProcessor]:
    """Load a Qwen-VL checkpoint folder (model + tokenizer + image processor) or hub id; with
    `attn_implementation` (eager, sdpa, ...) in place of the checkpoint's attention kernel. The vision
    tower attends over a batch of equal-sized images in one call (`rlfw.models.vision_attention`), and
    a training forward runs the last layer at the positions its loss reads (`rlfw.models.last_layer`)."""
    from transformers import AutoModelForImageTextToText

    from rlfw.models.last_layer import trim_last_layer
    from rlfw.models.vision_attention import pack_vision_attention

    kernel = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=DTYPES[dtype], **kernel)
    pack_vision_attention(model)
    trim_last_layer(model)
    return model, PolicyProcessor.from_pretrained(path)


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether `device` runs bf16 matmuls in hardware: a CUDA device that supports bf16, or a CPU with
    AVX512_BF16 or AMX tiles. Elsewhere (an AVX2-only CPU) torch emulates them, and a bf16 training
    forward ran 50x slower than float32 on such a CPU (experiments/bench/README.md)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_train_autocast(value: str | None, device: str | torch.device = "cpu",
                           key: str = "model.train_autocast") -> str | None:
    """model.train_autocast (or model.engine_autocast, named by `key`) as the forward uses it: "auto"
    is "bfloat16" where `device` has native bf16 (`native_bf16`) and None (plain float32) elsewhere;
    "bfloat16" stays, with a warning where it would be emulated; None stays None."""
    if value == "auto":
        return "bfloat16" if native_bf16(device) else None
    if value == "bfloat16" and not native_bf16(device):
        import warnings

        warnings.warn(f"{key}=bfloat16 on {torch.device(device)}, which has no native bf16 "
                      "(no AVX512_BF16 or AMX): torch emulates its matmuls, many times slower than float32. "
                      f"{key}=auto uses bf16 only where the hardware has it.", stacklevel=2)
    return value


def compile_language_model(model: torch.nn.Module) -> torch.nn.Module:
    """torch.compile the policy's language model (transformers' `get_decoder()`) in place, with
    dynamic shapes, so turns of any length and batches of any size share one graph; return it. The
    vision tower stays eager (compiling its blocks too was slower for an SFT step of 64 maze states
    on 2 CPU cores), and the top level (placing image features, the LM head) is cheap. Code that must
    not run compiled (generation with a KV cache) runs under `torch.compiler.set_stance("force_eager")`."""
    decoder = model.get_decoder()
    decoder.compile(dynamic=True)
    return decoder


def save_model_folder(model: torch.nn.Module, processor: PolicyProcessor, path: str | Path,
                      record_file: str, record: dict) -> None:
    """Write a model folder that `load_policy` (and so `model.path=`) takes as it is: the weights, a
    LoRA adapter merged into a copy (so `model`, possibly still training, keeps its adapter), the
    processor, and `record` as JSON in `record_file`. Whole or not at all (`rlfw.storage.atomic_dir`)."""
    import copy
    import json

    from rlfw.storage import LOCAL, atomic_dir

    to_save = copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    with atomic_dir(LOCAL, str(path)) as staging:
        to_save.save_pretrained(staging)
        processor.save_pretrained(staging)
        (Path(staging) / record_file).write_text(json.dumps(record, indent=2))


def apply_lora(model: torch.nn.Module, rank: int, alpha: int, dropout: float, target_modules: list[str]):
    """Wrap with a PEFT LoRA adapter; rank 0 returns the model for full fine-tuning."""
    if rank == 0:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                        bias="none")
    return get_peft_model(model, config)
