"""The vLLM rollout engine against rlfw's transformers engine, in one run on this machine.

Both engines run rlfw's own agent loop (`rlfw.rollout.agent_loop.collect`) on the same model
folder, mazes and prompts, one after the other in the same process (vLLM's engine core is its own
process, idle while the transformers engine works), each after a warm-up call:

- greedy decoding over distinct mazes: the two engines produce the same episodes token for token
  (checked), so the rates compare the same work;
- GRPO-shaped sampling (temperature 1, several samples per maze): the engines draw different
  random numbers, so episodes differ; rates are per episode and per generated token.

Cases: the shipped tiny policy with a LoRA adapter (vLLM's CPU LoRA cost grows with
`max_lora_rank`, so two ranks) and without, and a ~35M-parameter random-init config without and
with LoRA. Timings are one run each, on a shared machine: read the ratios.

    .venv-vllm/bin/python scripts/bench_vllm.py            # a few minutes on 2 cores
    .venv-vllm/bin/python scripts/bench_vllm.py --smoke    # one small case
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM's INFO lines would share stdout with the table

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rlfw.build import make_env_fn, prepare_base_model  # noqa: E402
from rlfw.config import ClusterConfig, LoraConfig, MazeEnvConfig, ModelConfig, VLLMConfig  # noqa: E402
from rlfw.distributed.workers import PolicyWorker  # noqa: E402
from rlfw.config import AlgoConfig  # noqa: E402
from rlfw.models.processing import PolicyProcessor  # noqa: E402
from rlfw.rollout.agent_loop import LoopLimits, collect  # noqa: E402
from rlfw.rollout.backends import build_engine  # noqa: E402
from rlfw.rollout.types import SamplingParams, Task  # noqa: E402

SHIPPED = ROOT / "checkpoints" / "tiny_vl_maze_sft"


def _episodes(engine, path: str, tasks, n, params, max_turns):
    import gymnasium as gym

    import envs  # noqa: F401

    processor = PolicyProcessor.from_pretrained(path)
    from envs.wrappers import CropImage

    env_list = [CropImage(gym.make("rlfw/Maze2D-v0", cell_px=8, max_turns=max_turns), processor.crop_px)
                for _ in range(len(tasks) * n)]
    t = time.perf_counter()
    eps = collect(engine, processor, env_list, tasks, n, params, LoopLimits(max_turns, 4, 8192))
    return eps, time.perf_counter() - t


def _rates(eps, seconds) -> dict:
    tokens = sum(e.generated_tokens for e in eps)
    return {"episodes/s": len(eps) / seconds, "tokens/s": tokens / seconds, "s": seconds,
            "turns": sum(e.turns for e in eps)}


def case(label: str, path: str, rank: int, max_lora_rank, workloads, threads: int, tmp: Path) -> list[tuple]:
    """Both engines on one model: a published adapter (rank > 0) or the weights as they are."""
    model = ModelConfig(name="bench", path=path, lora=LoraConfig(rank=rank, alpha=2 * max(rank, 1)))
    cluster = ClusterConfig(name="bench", vllm=VLLMConfig(memory_utilization=0.15, max_lora_rank=max_lora_rank))
    sync = str(tmp / f"sync_{label.replace(' ', '_')}")
    algo = AlgoConfig(name="grpo", tasks_per_step=1, tasks_per_optimizer_step=1)
    policy = PolicyWorker(model, algo, path, total_steps=1, seed=0, torch_threads=threads)
    if rank:  # a trained-looking adapter: LoRA B is zero at init, which some kernels might skip
        with torch.no_grad():
            for n, p in policy.trainer.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 1e-3)
    policy.save_weights(sync, 0)
    del policy
    results: dict[str, dict] = {}
    episodes: dict[str, dict] = {}
    for backend in ("transformers", "vllm"):
        engine = build_engine(backend, model, path, cluster, "cpu")
        engine.load_weights(sync)
        for name, (tasks, n, params, turns) in workloads.items():
            engine.set_seed(0)
            _episodes(engine, path, tasks[:1], 1, params, 2)  # warm-up
            engine.set_seed(0)
            eps, seconds = _episodes(engine, path, tasks, n, params, turns)
            results[(backend, name)] = _rates(eps, seconds)
            episodes[(backend, name)] = [e.actions for e in eps]
        del engine
        gc.collect()
    rows = []
    for name, (_, _, params, _) in workloads.items():
        t, v = results[("transformers", name)], results[("vllm", name)]
        same = "same episodes" if episodes[("transformers", name)] == episodes[("vllm", name)] else (
            "differ (sampled)" if not params.greedy else "DIFFER")
        lora = f"LoRA r{rank} (max_lora_rank {max_lora_rank or rank})" if rank else "no adapter"
        rows.append((label, lora, name, same, f"{t['episodes/s']:.1f}", f"{v['episodes/s']:.1f}",
                     f"{t['tokens/s']:.0f}", f"{v['tokens/s']:.0f}", f"{v['tokens/s'] / t['tokens/s']:.2f}x"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one small case")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="rlfw-bench-vllm-"))
    n_mazes, n_samples, turns = (4, 2, 2) if args.smoke else (32, 8, 8)
    greedy_tasks = [Task(seed=10**6 + i) for i in range(n_mazes)]
    workloads = {
        f"greedy, {n_mazes} mazes": (greedy_tasks, 1, SamplingParams(max_new_tokens=4, greedy=True), turns),
        f"T=1, {max(1, n_mazes // n_samples)} mazes x {n_samples}": (greedy_tasks[: max(1, n_mazes // n_samples)], n_samples,
                                                          SamplingParams(temperature=1.0, max_new_tokens=4), turns),
    }
    from bench import LARGE  # the ~35M config of scripts/bench.py

    cases = [("tiny (shipped)", str(SHIPPED), 8, None)]
    if not args.smoke:
        large = prepare_base_model(ModelConfig(name="tiny_vl", tiny=LARGE), make_env_fn(
            MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", cell_px=8)), tmp / "large", seed=0)
        cases = [("tiny (shipped)", str(SHIPPED), 0, None), ("tiny (shipped)", str(SHIPPED), 8, None),
                 ("tiny (shipped)", str(SHIPPED), 32, None), ("large (~35M)", large, 0, None),
                 ("large (~35M)", large, 8, None)]
    header = ["model", "adapter", "workload", "episodes", "transformers ep/s", "vLLM ep/s",
              "transformers tok/s", "vLLM tok/s", "vLLM / transformers"]
    rows = []
    for label, path, rank, max_rank in cases:
        rows += case(label, path, rank, max_rank, workloads, args.threads, tmp)
        print(f"done: {label} rank {rank}", file=sys.stderr, flush=True)
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    print(f"\n{args.threads} torch thread(s) for the transformers engine; vLLM CPU backend defaults; "
          f"<= {turns} turns, 4 tokens per turn.")


if __name__ == "__main__":
    main()
