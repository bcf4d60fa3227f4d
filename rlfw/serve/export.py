"""Put a trained adapter where `python -m rlfw.serve` loads adapters from.

    python -m rlfw.serve.export outputs/<run>/exports/global_step_400 adapters --name grpo400
    python -m rlfw.serve.export outputs/<run>/lora_sync/v400 s3://bucket/adapters --name grpo400 --base-id qwen3vl-8b-maze

Writes `<dest>/<name>/adapter_config.json` + `adapter_model.safetensors`, the base referenced by its
served id (`--base-id`, default the name of the run's model folder), not the training machine's path.
Then request it as `model="<base id>:<name>"`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlfw.serve.adapters import export_adapter


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter", type=Path, help="a PEFT adapter folder (exports/global_step_N or lora_sync/vN)")
    ap.add_argument("dest", help="the adapters folder or URL (serve.adapters_path)")
    ap.add_argument("--name", required=True, help="the adapter's name at the endpoint: [A-Za-z0-9._-]+")
    ap.add_argument("--base-id", help="the served base model's id (serve.model_id); default: the name of the "
                                      "adapter's base folder")
    args = ap.parse_args(argv)
    config = args.adapter / "adapter_config.json"
    if not config.exists():
        ap.error(f"{args.adapter} holds no adapter_config.json: not a PEFT adapter folder")
    base = args.base_id or Path(str(json.loads(config.read_text()).get("base_model_name_or_path") or "base")
                                .rstrip("/")).name
    try:
        dst = export_adapter(args.adapter, args.dest, args.name, base)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"rlfw.serve.export: {args.adapter} -> {dst} (request it as model=\"{base}:{args.name}\")")
    return dst


if __name__ == "__main__":
    main()
