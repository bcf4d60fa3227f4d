"""The language model's last layer at the kept positions only (`rlfw.models.last_layer`, what
`load_policy` gives) against transformers' layer at every position, on the main job's SFT step: 64
oracle-labelled maze states (half at junctions), forward, backward and AdamW, with the preset
stage's speed settings (eager attention, `model.train_autocast=auto`, the language model compiled).

Both sides are the same weights in one process and train their own copies on the same batches. The
sides alternate (A B A B ...) over the rounds, so a noisy machine slows both alike; the table gives
each side's median and the ratio. Each side's first round is a warm-up (the compile).

    python scripts/bench_last_layer.py                  # the shipped SFT checkpoint, 2 threads
    python scripts/bench_last_layer.py --smoke          # a random tiny policy, seconds
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import MazeEnvConfig, ModelConfig, TinyVLSpec
from rlfw.models import compile_language_model, load_policy, resolve_train_autocast
from rlfw.models.last_layer import untrim_last_layer
from rlfw.rollout.demos import DemoSampler, to_segment
from rlfw.sft import sft_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="checkpoints/tiny_vl_maze_sft", help="a policy folder")
    ap.add_argument("--batch", type=int, default=64, help="states per SFT step")
    ap.add_argument("--steps", type=int, default=10, help="timed SFT steps per side per round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side, alternating")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (an SFT run's sft.torch_threads)")
    ap.add_argument("--smoke", action="store_true", help="a random tiny policy, uncompiled, tiny sizes")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.steps, args.rounds = 8, 1, 1
    torch.set_num_threads(args.threads)

    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0")
    path = args.model
    if args.smoke:
        spec = TinyVLSpec(num_layers=2, hidden_size=64, intermediate_size=128)
        path = prepare_base_model(ModelConfig(name="tiny_vl", tiny=spec), make_env_fn(env_cfg),
                                  Path(tempfile.mkdtemp(prefix="rlfw-bench-")), seed=0)
    trimmed, processor = load_policy(path, attn_implementation="eager")
    every = copy.deepcopy(trimmed)
    assert untrim_last_layer(every) == 1, "load_policy gave no LastLayerAtQueries (not a Qwen3-VL model?)"
    sides = {"every position": every, "kept positions": trimmed}
    autocast = resolve_train_autocast("auto")
    sampler = DemoSampler(make_env_fn(env_cfg, processor.crop_px), 0, "all_squares", 0.0, junction_fraction=0.5)
    batches = [[to_segment(processor, *s) for s in sampler.sample(args.batch)] for _ in range(args.steps)]

    trainers = {}
    for side, model in sides.items():
        model.train()
        if not args.smoke:
            compile_language_model(model)
        params = [p for p in model.parameters() if p.requires_grad]
        trainers[side] = (model, torch.optim.AdamW(params, lr=1e-5))

    def sft_steps(side: str) -> float:
        model, optimizer = trainers[side]
        t0 = time.perf_counter()
        for segments in batches:
            loss = sft_loss(model, processor, segments, autocast)[0]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return args.steps * args.batch / (time.perf_counter() - t0)

    for side in sides:  # warm-up: the compile, the allocator
        print(f"warm-up {side}: {sft_steps(side):.1f} states/s", flush=True)
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(args.rounds):
        for side in sides:
            rates[side].append(sft_steps(side))
            print(f"round {r} {side}: {rates[side][-1]:.1f} states/s", flush=True)

    print(f"\n{args.steps} SFT steps of {args.batch} states per side per round, {args.rounds} rounds, "
          f"{args.threads} thread(s), train autocast: {autocast or 'float32'}, model: {'smoke' if args.smoke else path}\n")
    a, b = (statistics.median(rates[s]) for s in sides)
    print("| work | last layer at every position (median) | at the kept positions (median) | kept / every |\n"
          "|---|---:|---:|---:|")
    print(f"| SFT step (states/s, forward + backward + AdamW) | {a:.1f} | {b:.1f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
