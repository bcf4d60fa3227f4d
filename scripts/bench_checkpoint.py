"""Checkpoint save and load time and size for tiny_vl, LoRA and full fine-tuning.

Both are measured in one run on the same machine. A save blocks training for exactly the write
(it runs between steps, after the weights are synced to the engines).

    python scripts/bench_checkpoint.py            # default tiny_vl (6 layers x 128)
    python scripts/bench_checkpoint.py --smoke    # seconds; run by the test suite
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.checkpoint import CheckpointStore
from rlfw.config import AlgoConfig, Config, LoraConfig, MazeEnvConfig, ModelConfig
from rlfw.distributed.workers import PolicyWorker
from rlfw.config import TinyVLSpec


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128) if args.smoke else TinyVLSpec(num_layers=6)
    repeats = 1 if args.smoke else args.repeats
    tmp = Path(tempfile.mkdtemp(prefix="rlfw-ckpt-bench-"))
    make_env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0"))
    rows = []
    for label, rank in [("LoRA r16", 16), ("full fine-tuning", 0)]:
        model = ModelConfig(name="tiny_vl", tiny=spec, lora=LoraConfig(rank=rank))
        path = prepare_base_model(model, make_env, tmp, seed=0)
        worker = PolicyWorker(model, AlgoConfig(name="grpo"), path, total_steps=10, seed=0, torch_threads=1)
        # one optimizer step so AdamW has its moment buffers, as in a real checkpoint
        params = [p for p in worker.trainer.model.parameters() if p.requires_grad]
        sum(p.sum() for p in params).backward()
        worker.trainer.optimizer.step()
        store = CheckpointStore(str(tmp / f"ckpt_{rank}"))
        cfg = Config(model=model)
        t0 = time.perf_counter()
        for step in range(1, repeats + 1):
            saved = store.save(step, worker, cfg, max_to_keep=1)
        t_save = (time.perf_counter() - t0) / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            found = store.find_resume()
            worker.load_checkpoint(store.url_of(f"{found.path}/policy_state.pt"), {})
        t_load = (time.perf_counter() - t0) / repeats
        n_train = sum(p.numel() for p in params)
        rows.append((label, n_train, _size(Path(saved)), t_save, t_load))
    print(f"\n| checkpoint | trainable params | size | save (s) | verify + load (s) |")
    print("|---|---:|---:|---:|---:|")
    for label, n, size, ts, tl in rows:
        print(f"| {label} | {n / 1e6:.2f}M | {size / 2**20:.1f} MiB | {ts:.3f} | {tl:.3f} |")
    print(f"\ncommand: python scripts/bench_checkpoint.py{' --smoke' if args.smoke else ''}")


if __name__ == "__main__":
    main()
