"""rlfw's performance beside the machine's limit and its peers, measured in one run.

Machines here are shared and noisy, so every comparison is made inside this one run, back to
back, and reported as a ratio; absolute numbers are for orientation only.

1. Machine limit: sustained torch matmul FLOP/s (fp32 and bf16, square sizes) and memory bandwidth
   (a large tensor copy), at the thread count the rest of the benchmark uses.
2. Rollout: rlfw's batched multi-turn rollout against the two loops a user would write with
   transformers (scripts/bench_rollout.py): one `model.generate` call per turn batched over the
   active episodes, and one per episode per turn; same model, mazes, seeds and sampling settings.
3. Training: tokens/s and achieved FLOP/s of the policy update (forward, backward, AdamW) on real
   maze turns, for the shipped tiny_vl architecture (with GRPO's LoRA) and a ~35M-parameter config
   (full fine-tuning), as a fraction of the matmul limit. FLOPs are counted by
   `torch.utils.flop_counter` on one update, then the update is timed without the counter.
4. Against TRL: see scripts/bench_trl.py (run here when TRL is installed: pip install -e ".[bench]").
5. Memory: peak RSS of the training worker and of the engine worker, from a short GRPO run through
   Ray (each worker reports its own process's peak).
6. FSDP2: the policy update on 1 and 2 gloo ranks and the adapter gather (scripts/bench_fsdp.py).
7. vLLM: the vLLM engine against rlfw's (scripts/bench_vllm.py, run with .venv-vllm's Python when
   `bash scripts/setup.sh --vllm` made it).
8. Serving: `python -m rlfw.serve` (Ray Serve LLM) against `vllm serve` on the same model and adapter
   (scripts/bench_serve.py, .venv-vllm's Python).

    python scripts/bench.py                 # full sizes, about 10 minutes on 2 cores
    python scripts/bench.py --smoke         # seconds; run by the test suite (timings never asserted)
    python scripts/bench.py --out experiments/bench/results.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rlfw.build import make_env_fn, prepare_base_model  # noqa: E402
from rlfw.config import AlgoConfig, LoraConfig, MazeEnvConfig, ModelConfig, TinyVLSpec  # noqa: E402
from rlfw.distributed.workers import EngineWorker, PolicyWorker  # noqa: E402
from rlfw.models.processing import PolicyProcessor  # noqa: E402
from rlfw.rollout.types import TrainBatch  # noqa: E402

SHIPPED = ROOT / "checkpoints" / "tiny_vl_maze_sft"
# the shipped checkpoint's architecture (conf/experiment/sft_maze.yaml)
TINY = TinyVLSpec(num_layers=6, hidden_size=128, intermediate_size=512, patch_size=8, image_crop_px=8)
# a CPU-sized "large" policy: 8 x 512 language model, 4 x 256 vision tower (about 35M parameters)
LARGE = TinyVLSpec(num_layers=8, hidden_size=512, num_heads=8, num_kv_heads=4, intermediate_size=2048,
                   vision_hidden_size=256, vision_depth=4, vision_heads=4, patch_size=8, image_crop_px=8)
SECTIONS = ["rollout", "training", "trl", "memory", "fsdp", "vllm", "serve"]
SMOKE = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128, vision_depth=1, patch_size=8,
                   image_crop_px=8)


# -- 1. the machine's limit -----------------------------------------------------------------------
def matmul_flops(n: int, dtype: torch.dtype, seconds: float) -> float:
    """Sustained FLOP/s of an n x n @ n x n matmul, repeated for about `seconds`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def copy_bandwidth(mib: int, seconds: float) -> float:
    """Memory bandwidth in bytes/s of a large tensor copy (read + write counted)."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dst.copy_(src)
        reps += 1
    return 2 * src.numel() * 4 * reps / (time.perf_counter() - t0)


def machine_limit(args) -> tuple[list[tuple], float]:
    sizes = [128, 256] if args.smoke else [256, 512, 1024, 2048]
    rows, peak = [], 0.0
    for dtype in (torch.float32, torch.bfloat16):
        for n in sizes:
            f = matmul_flops(n, dtype, 0.2 if args.smoke else 2.0)
            if dtype == torch.float32:
                peak = max(peak, f)
            rows.append((f"matmul {str(dtype).split('.')[-1]} {n}x{n}", f"{f / 1e9:.1f} GFLOP/s"))
    bw = copy_bandwidth(16 if args.smoke else 512, 0.2 if args.smoke else 2.0)
    rows.append(("memory copy bandwidth (read + write)", f"{bw / 1e9:.1f} GB/s"))
    return rows, peak


# -- 2. rollout -------------------------------------------------------------------------------------
def rollout(args, path: Path) -> str:
    """rlfw's `collect` beside both `model.generate` baselines (scripts/bench_rollout.py)."""
    from bench_rollout import HEADER, compare, rows

    n_tasks, n_samples, max_turns = (2, 2, 2) if args.smoke else (8, 8, 10)
    engine = EngineWorker(ModelConfig(name="tiny_vl", path=str(path), lora=LoraConfig(rank=32, alpha=64)),
                          str(path), torch_threads=args.threads)
    results, _ = compare(engine, PolicyProcessor.from_pretrained(path), n_tasks, n_samples, max_turns)
    stats = engine.engine.stats
    body = [(f"rollout {name}", *rest) for name, *rest in rows(results)]
    body.append(("prompts prefilled / prompts (rlfw)", f"{stats['prefilled']}/{stats['prompts']}", "all", "all", "", ""))
    return (f"Model: {'a smoke-size tiny_vl' if args.smoke else 'the shipped SFT checkpoint'} with a LoRA r32 adapter "
            f"(merged for inference by rlfw), temperature 1.0, {n_tasks} mazes x {n_samples} samples, <= {max_turns} "
            "turns; every side starts from `torch.manual_seed(0)` and the same mazes and seeds.\n\n" + table(HEADER, body))


# -- 3. training ------------------------------------------------------------------------------------
def training_segments(path: Path, n: int):
    """Real training turns: maze states (every open square) with their BFS-best move as the reply."""
    from rlfw.rollout.demos import DemoSampler, to_segment

    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=20, cell_px=8)
    processor = PolicyProcessor.from_pretrained(path)
    sampler = DemoSampler(make_env_fn(env_cfg, processor.crop_px), seed=0, mode="all_squares", noise=0.0)
    return [to_segment(processor, *state) for state in sampler.sample(n)]


# the training forward's speed settings (model.attn_implementation, model.train_autocast, model.compile)
FAST = {"attn_implementation": "eager", "train_autocast": "auto"}
FASTEST = {**FAST, "compile": True}


def training(args, spec: TinyVLSpec, lora_rank: int, label: str, peak: float, tmp: Path,
             speed: dict | None = None) -> tuple[tuple, float]:
    """One row (the update's tokens/s and achieved FLOP/s) and its tokens/s; with `speed`, ModelConfig
    fields of the training forward (FAST, FASTEST), whose first update (a compile's cost) is timed on its own."""
    from torch.utils.flop_counter import FlopCounterMode

    make_env = make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", cell_px=8))
    model_cfg = ModelConfig(name="tiny_vl", tiny=spec, lora=LoraConfig(rank=lora_rank, alpha=2 * max(lora_rank, 1)),
                            **(speed or {}))
    path = prepare_base_model(model_cfg, make_env, tmp / f"model_{lora_rank}", seed=0)
    n = 8 if args.smoke else 64
    algo = AlgoConfig(name="grpo", tasks_per_step=1, tasks_per_optimizer_step=1, sequences_per_forward=n, lr=1e-5)
    worker = PolicyWorker(model_cfg, algo, str(path), total_steps=100, seed=0, torch_threads=args.threads)
    trainer = worker.trainer
    trainer.dedup = False  # measure raw throughput on distinct sequences
    segments = training_segments(path, n)
    batch = TrainBatch(segments, [1.0 if i % 2 else -1.0 for i in range(n)], [0] * n)
    tokens = sum(len(s.token_ids) for s in segments)
    params = sum(p.numel() for p in trainer.model.parameters())
    t0 = time.perf_counter()
    trainer.update(batch, step=1)  # warm-up (and the compile)
    first = time.perf_counter() - t0
    with FlopCounterMode(display=False) as counter:
        with torch.compiler.set_stance("force_eager"):  # the counter sees the eager ops; the FLOPs are the same
            trainer.update(batch, step=1)
    flops = counter.get_total_flops()
    reps = 1 if args.smoke else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        trainer.update(batch, step=1)
    dt = (time.perf_counter() - t0) / reps
    settings = ", ".join(f"{k}={v}" for k, v in (speed or {}).items()) or "defaults"
    if (speed or {}).get("train_autocast") == "auto":
        settings += f" ({trainer.autocast or 'float32'} here)"
    row = (f"{spec.num_layers}x{spec.hidden_size} {label}, {params / 1e6:.1f}M params, {n} turns x {tokens // n} tokens; "
           f"model: {settings}", f"{tokens / dt:.0f} tokens/s", f"{flops / dt / 1e9:.1f} GFLOP/s", f"{flops / dt / peak:.0%}",
           f"{first:.1f} s")
    return row, tokens / dt


# -- 5. memory -------------------------------------------------------------------------------------
def memory(args, tmp: Path) -> list[tuple]:
    """Peak RSS of each worker from a short GRPO run through Ray (the README's main job, 2 steps)."""
    out = tmp / "memory_run"
    preset = ["experiment=debug"] if args.smoke else ["experiment=maze_from_sft", "trainer.total_steps=2"]
    cmd = [sys.executable, "-m", "rlfw.run", *preset, "trainer.eval_interval=0", "trainer.heldout_eval_size=0",
           "trainer.ckpt_interval=0", "logger=console", f"hydra.run.dir={out}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "memory/trainer_peak_rss_mb" in r][-1]
    return [("peak RSS, training worker (LoRA r32, AdamW)", f"{last['memory/trainer_peak_rss_mb']:.0f} MiB"),
            ("peak RSS, engine worker", f"{last['memory/engine_peak_rss_mb']:.0f} MiB")]


def table(header: list[str], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    ap.add_argument("--skip", nargs="*", default=[], choices=SECTIONS)
    ap.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="rlfw-bench-"))
    command = "python scripts/bench.py" + (" --smoke" if args.smoke else "") + (
        f" --threads {args.threads}" if args.threads != (os.cpu_count() or 1) else "")

    sections = [f"# rlfw benchmark\n\n{datetime.date.today()} · {platform.processor() or platform.machine()}, "
                f"{os.cpu_count()} cores · torch {torch.__version__} · {args.threads} torch thread(s)\n"
                f"command: `{command}`"]

    def emit(text: str, only: str | None = None) -> None:
        if only:  # the command that reproduces just this section
            others = " ".join(x for x in SECTIONS if x != only)
            text += f"\n\nreproduce: `{command} --skip {others}`"
        print(text + "\n", flush=True)
        sections.append(text)

    emit(sections.pop())
    limit_rows, peak = machine_limit(args)
    emit("## 1. Machine limit\n\n" + table(["measure", "value"], limit_rows)
         + f"\n\nDenominator for utilisation: best fp32 matmul, {peak / 1e9:.1f} GFLOP/s.")

    if args.smoke:
        path = prepare_base_model(ModelConfig(name="tiny_vl", tiny=SMOKE), make_env_fn(
            MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", cell_px=8)), tmp / "smoke_model", seed=0)
    else:
        path = SHIPPED
    if "rollout" not in args.skip:
        emit("## 2. Rollout: rlfw against batched and per-episode `model.generate` loops\n\n"
             + rollout(args, path), "rollout")
    if "training" not in args.skip:
        tiny = SMOKE if args.smoke else TINY
        runs = [training(args, tiny, 32, "tiny_vl, LoRA r32", peak, tmp, speed) for speed in (None, FAST, FASTEST)]
        runs.append(training(args, SMOKE if args.smoke else LARGE, 0, "large, full fine-tuning", peak, tmp))
        rows = [row for row, _ in runs]
        ratios = "; ".join(f"{' + '.join(f'{k}={v}' for k, v in speed.items())}: "
                           f"{rate / runs[0][1]:.2f}x the defaults' tokens/s"
                           for speed, (_, rate) in zip((FAST, FASTEST), runs[1:3]))
        emit("## 3. Training: the policy update against the matmul limit\n\n"
             + table(["update", "tokens/s", "achieved", "of fp32 matmul limit", "first update"], rows)
             + f"\n\nThe training forward's speed settings, same update: {ratios}. The first update "
             "includes the compile where model.compile=true; FLOPs are counted on the eager ops.", "training")
    if "trl" not in args.skip:
        emit("## 4. Against TRL's GRPOTrainer\n\n" + trl_section(args), "trl")
    if "memory" not in args.skip:
        emit("## 5. Memory\n\n" + table(["process", "peak RSS"], memory(args, tmp)), "memory")
    if "fsdp" not in args.skip:
        emit("## 6. FSDP2: 1 and 2 training ranks\n\n" + script_section("bench_fsdp.py", args), "fsdp")
    if "vllm" not in args.skip:
        emit("## 7. The vLLM engine against rlfw's\n\n" + script_section("bench_vllm.py", args, ROOT / ".venv-vllm" / "bin" / "python"), "vllm")
    if "serve" not in args.skip:
        emit("## 8. Serving: Ray Serve LLM against vllm serve\n\n" + script_section("bench_serve.py", args, ROOT / ".venv-vllm" / "bin" / "python"), "serve")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n\n".join(sections) + "\n")
        print(f"wrote {args.out}")


def script_section(script: str, args, python: Path | None = None) -> str:
    """Another benchmark script's table (run with `python`, default this interpreter)."""
    if python is not None and not python.exists():
        return f"skipped: {python} is missing (`bash scripts/setup.sh --vllm` makes it)"
    cmd = [str(python or sys.executable), str(ROOT / "scripts" / script), *(["--smoke"] if args.smoke else [])]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return f"{script} failed (exit {done.returncode}):\n\n```\n{done.stderr[-2000:]}\n```"
    return done.stdout.strip()


def trl_section(args) -> str:
    """scripts/bench_trl.py's table (it says how to install TRL when it is missing)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_trl.py"), *(["--smoke"] if args.smoke else []),
           "--threads", str(args.threads)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return f"bench_trl.py failed (exit {done.returncode}):\n\n```\n{done.stderr[-2000:]}\n```"
    return done.stdout.strip()


if __name__ == "__main__":
    main()
