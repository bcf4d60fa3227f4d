"""The policy update on 1 and on 2 FSDP2 ranks (gloo) on this machine, in one run.

Model: scripts/bench.py's ~35M-parameter config (8 x 512 language model, 4 x 256 vision tower),
the same 64 real maze turns (`bench.training_segments`), one update each (after a warm-up), LoRA r32
and full fine-tuning. With 2 ranks each rank does half the micro-batches, and FSDP2 all-gathers
every block's parameters in each forward and backward and reduce-scatters its gradients.
Communication share: the time torch's profiler puts in c10d collectives on rank 0, over the
update's wall time. Gather: the adapter (LoRA r32) gathered whole for a sync, its time and the rise
of rank 0's peak RSS.

On 2 cores, 2 ranks are not expected to be faster: each rank runs on one core (one torch thread)
where one rank had two, and the collectives are added work.

    python scripts/bench_fsdp.py            # a few minutes on 2 cores
    python scripts/bench_fsdp.py --smoke    # seconds (the smoke-size model)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

COMM = ("allgather", "all_gather", "reduce_scatter", "allreduce", "all_reduce", "c10d::", "gloo")


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rank(rank, world, address, port, model_cfg, path, batch, threads, out_file):
    """One rank's update and gather; rank 0 saves its measurements to out_file."""
    from rlfw.config import AlgoConfig
    from rlfw.distributed.ranks import Rendezvous
    from rlfw.distributed.workers import PolicyWorker

    n = len(batch.segments)
    algo = AlgoConfig(name="grpo", tasks_per_step=1, tasks_per_optimizer_step=1, sequences_per_forward=8, lr=1e-5)
    worker = PolicyWorker(model_cfg, algo, path, total_steps=100, seed=0, torch_threads=threads,
                          rendezvous=Rendezvous(address, port, rank, world) if world > 1 else None)
    trainer = worker.trainer
    trainer.dedup = False
    trainer.update(batch, step=1)  # warm-up
    trainer.ranks.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        trainer.update(batch, step=1)
        seconds = time.perf_counter() - t0
    comm = sum(e.self_cpu_time_total for e in prof.key_averages()
               if any(k in e.key.lower() for k in COMM)) / 1e6
    rss0 = _peak_rss_mb()
    trainer.ranks.barrier()
    t0 = time.perf_counter()
    adapter = trainer.ranks.full_state(trainer.model, trainable_only=True)
    gather = time.perf_counter() - t0
    if rank == 0:
        torch.save(dict(seconds=seconds, comm=comm, gather=gather, gather_rss=_peak_rss_mb() - rss0,
                        adapter_mb=sum(t.numel() * t.element_size() for t in adapter.values()) / 2**20,
                        tokens=sum(len(s.token_ids) for s in batch.segments), n=n), out_file)
    trainer.ranks.close()
    # A process that ran torch.profiler can abort in its exit-time teardown ("terminate called
    # without an active exception", SIGABRT, about 1 rank process in 15 here, always after this
    # function returned): the measurements are saved, so skip that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def measure(world: int, model_cfg, path: str, batch, threads: int, tmp: Path) -> dict:
    from rlfw.distributed.ranks import free_address

    out = tmp / f"result_{world}.pt"
    address, port = free_address()
    mp.start_processes(_rank, args=(world, address, port, model_cfg, path, batch, threads, str(out)),
                       nprocs=world, start_method="spawn", join=True)
    return torch.load(out, weights_only=False)


def main() -> None:
    from bench import LARGE, SMOKE, training_segments
    from rlfw.build import make_env_fn, prepare_base_model
    from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig
    from rlfw.rollout.types import TrainBatch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="rlfw-bench-fsdp-"))
    spec, n = (SMOKE, 8) if args.smoke else (LARGE, 64)
    make_env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", cell_px=8))
    rows = []
    for rank in (32, 0):
        model_cfg = ModelConfig(name="tiny_vl", tiny=spec, lora=LoraConfig(rank=rank, alpha=2 * max(rank, 1)))
        path = prepare_base_model(model_cfg, make_env, tmp / f"model_{rank}", seed=0)
        segments = training_segments(Path(path), n)
        batch = TrainBatch(segments, [1.0 if i % 2 else -1.0 for i in range(n)], [0] * n)
        one = measure(1, model_cfg, path, batch, cores, tmp)
        two = measure(2, model_cfg, path, batch, max(1, cores // 2), tmp)
        label = f"LoRA r{rank}" if rank else "full fine-tuning"
        for world, r, threads in ((1, one, cores), (2, two, max(1, cores // 2))):
            rows.append((label, world, threads, f"{r['tokens'] / r['seconds']:.0f}",
                         f"{one['seconds'] / r['seconds']:.2f}x", f"{r['comm'] / r['seconds']:.0%}",
                         f"{r['adapter_mb']:.1f} MiB in {r['gather'] * 1e3:.0f} ms, +{r['gather_rss']:.0f} MiB peak"))
    header = ["update", "ranks", "threads/rank", "tokens/s", "vs 1 rank", "in collectives (rank 0)",
              "gather of the trainable weights (rank 0)"]
    print(f"{'smoke-size' if args.smoke else '~35M-parameter'} model, {n} maze turns, one update, {cores} cores\n")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")


if __name__ == "__main__":
    main()
