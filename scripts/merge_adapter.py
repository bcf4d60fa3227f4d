"""Ship a run's policy as one model folder: its LoRA adapter at step N merged into its base model.

    python scripts/merge_adapter.py runs/<run> --step 220 --out checkpoints/tiny_vl_maze_rl
    python scripts/merge_adapter.py runs/<run> --step 220 --out <folder> --base checkpoints/tiny_vl_maze_sft

The adapter is `<run>/lora_sync/v<N>`: the policy after step N's update, the one the run evaluated
at step N. The base is the model the run's RL started from, read from its saved `config.yaml`
(rlfw.config_io): its SFT stage's checkpoint where it had one (`sft_stage`), else its `model.path`;
or `--base` where that folder has moved. The folder takes `model.path=` (further training, `python -m
rlfw.eval`) as it is. Beside the weights and the base's processor it holds `rlfw_rl.json`: the run's
command, the step, the seed, where the adapter and base came from, and the run's own evaluation
metrics at that step, so anyone can re-evaluate the folder against them. The run names its env's
evaluation set after the env (`eval/maze/...`); the record names it after the set (`eval/eval64/...`),
as SFT checkpoints do.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlfw.config import rl_start_model
from rlfw.config_io import RUN_CONFIG_FILE, load_run_config


def step_metrics(run: Path, step: int, env_name: str, eval_set: str) -> dict:
    """The run's logged evaluation metrics at `step` (every line of that step merged), the env's
    set renamed from `eval/<env name>/` to `eval/<eval set>/`."""
    merged = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("step") == step:
            merged.update(row)
    metrics = {k: v for k, v in merged.items() if k.startswith("eval/") or k == "timing/elapsed_min"}
    if any(k.startswith(f"eval/{eval_set}/") for k in metrics):  # e.g. env.eval_set=heldout beside the held-out pass
        return dict(sorted(metrics.items()))  # renaming would overwrite that set's metrics: keep the run's names
    return {k.replace(f"eval/{env_name}/", f"eval/{eval_set}/", 1): v for k, v in sorted(metrics.items())}


def run_command(run: Path) -> str | None:
    """`python -m rlfw.run <overrides>` as Hydra recorded them (`.hydra/overrides.yaml`), if it did."""
    overrides = run / ".hydra" / "overrides.yaml"
    if not overrides.exists():
        return None
    from omegaconf import OmegaConf

    return " ".join(["python -m rlfw.run", *OmegaConf.load(overrides)])


def merge(run: Path, step: int, out: Path, base: str | None = None) -> dict:
    """Write `out` (whole or not at all) and return its record. Refuses, before loading anything, a
    run folder without its config, a step without a saved adapter, and a missing base."""
    from peft import PeftModel

    from rlfw.models import load_policy, save_model_folder
    from rlfw.validation import model_folder_errors

    if not (run / RUN_CONFIG_FILE).exists():
        raise SystemExit(f"{run / RUN_CONFIG_FILE} is missing: {run} is not an rlfw.run run folder")
    cfg = load_run_config(run)
    adapter = run / "lora_sync" / f"v{step}"
    if not (adapter / "adapter_config.json").exists():
        saved = sorted(int(p.name[1:]) for p in (run / "lora_sync").glob("v*") if p.name[1:].isdigit())
        raise SystemExit(f"{adapter} holds no adapter_config.json: no LoRA adapter of step {step} in this run "
                         f"(saved: {saved or 'none'}; the run keeps the last two, and a full fine-tuning run "
                         "has no adapter to merge)")
    base = base or rl_start_model(cfg)  # an SFT stage's checkpoint, where the run had one
    if errs := model_folder_errors(base, "the run's base model"):
        raise SystemExit(f"{errs[0]}: give the base model folder with --base")
    metrics = step_metrics(run, step, cfg.env.name, cfg.env.eval_set)
    if not any(k.startswith("eval/") for k in metrics):  # a training row's elapsed time is not an evaluation
        raise SystemExit(f"{run / 'metrics.jsonl'} has no evaluation at step {step}: merge a step the run evaluated")
    model, processor = load_policy(base, cfg.model.dtype)
    model = PeftModel.from_pretrained(model, str(adapter))
    # paths as given (relative ones stay relative): a shipped folder should not name this machine's folders
    record = {"step": step, "seed": cfg.seed, "command": run_command(run), "run": str(run), "adapter": str(adapter),
              "base": base, **metrics}
    save_model_folder(model, processor, out, "rlfw_rl.json", record)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help=f"an rlfw.run run folder ({RUN_CONFIG_FILE}, lora_sync/vN/, metrics.jsonl)")
    ap.add_argument("--step", type=int, required=True, help="the step whose adapter to merge (one the run evaluated)")
    ap.add_argument("--out", type=Path, required=True, help="the model folder to write (replaced whole if it exists)")
    ap.add_argument("--base", help="the base model folder, where the run's (its model.path, or its SFT "
                    "stage's checkpoint) has moved since")
    args = ap.parse_args()
    record = merge(args.run, args.step, args.out, args.base)
    scores = {k: v for k, v in record.items() if k.endswith("/pass_at_1")}
    print(f"wrote {args.out} (step {args.step}, seed {record['seed']}): {scores}")


if __name__ == "__main__":
    main()
