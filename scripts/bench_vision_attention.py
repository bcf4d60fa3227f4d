"""The vision tower's batched attention (`rlfw.models.vision_attention`, what `load_policy` gives)
against transformers' per-image loop, on the work the main job does with it:

- an SFT step as the preset's stage runs it: 64 oracle-labelled maze states (half at junctions),
  forward, backward and AdamW, with the stage's speed settings (eager attention,
  `model.train_autocast=auto`, the language model compiled);
- sampled multi-turn maze rollouts through the transformers engine, as GRPO collects them.

Both sides are the same weights in one process. The sides alternate (A B A B ...) over the rounds,
so a noisy machine slows both alike; the table gives each side's median and the ratio.

    python scripts/bench_vision_attention.py                  # the shipped SFT checkpoint, 2 threads
    python scripts/bench_vision_attention.py --smoke          # a random tiny policy, seconds
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
from rlfw.models.vision_attention import unpack_vision_attention
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.demos import DemoSampler, to_segment
from rlfw.rollout.engine import TransformersEngine
from rlfw.rollout.types import SamplingParams, Task
from rlfw.sft import sft_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="checkpoints/tiny_vl_maze_sft", help="a policy folder")
    ap.add_argument("--batch", type=int, default=64, help="states per SFT step")
    ap.add_argument("--steps", type=int, default=10, help="timed SFT steps per side per round")
    ap.add_argument("--tasks", type=int, default=8, help="mazes per rollout")
    ap.add_argument("--samples", type=int, default=8, help="episodes per maze")
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side, alternating")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (an SFT run's sft.torch_threads)")
    ap.add_argument("--smoke", action="store_true", help="a random tiny policy and tiny sizes")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.steps, args.tasks, args.samples, args.max_turns, args.rounds = 8, 1, 2, 2, 2, 1
    torch.set_num_threads(args.threads)

    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=args.max_turns)
    path = args.model
    if args.smoke:
        spec = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128)
        path = prepare_base_model(ModelConfig(name="tiny_vl", tiny=spec), make_env_fn(env_cfg),
                                  Path(tempfile.mkdtemp(prefix="rlfw-bench-")), seed=0)
    packed, processor = load_policy(path, attn_implementation="eager")
    loop = copy.deepcopy(packed)
    unpack_vision_attention(loop)  # transformers' own vision attention: one kernel call per image
    sides = {"per-image loop": loop, "batched": packed}
    autocast = resolve_train_autocast("auto")
    make_env = make_env_fn(env_cfg, processor.crop_px)
    sampler = DemoSampler(make_env, 0, "all_squares", 0.0, junction_fraction=0.5)

    # SFT steps: each side trains its own copy on the same batches
    trainers = {}
    for side, model in sides.items():
        train = copy.deepcopy(model).train()
        if not args.smoke:
            compile_language_model(train)
        params = [p for p in train.parameters() if p.requires_grad]
        trainers[side] = (train, params, torch.optim.AdamW(params, lr=1e-5))
    batches = [[to_segment(processor, *s) for s in sampler.sample(args.batch)] for _ in range(args.steps)]

    def sft_steps(side: str) -> float:
        model, params, optimizer = trainers[side]
        t0 = time.perf_counter()
        for segments in batches:
            loss = sft_loss(model, processor, segments, autocast)[0]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return args.steps * args.batch / (time.perf_counter() - t0)

    for side in sides:  # warm-up: the compile, the allocator
        print(f"warm-up {side}: {sft_steps(side):.1f} states/s", flush=True)

    # rollouts through the transformers engine
    engines = {side: TransformersEngine(model.eval(), processor, merge_lora=False) for side, model in sides.items()}
    envs = [make_env() for _ in range(args.tasks * args.samples)]
    params = SamplingParams(temperature=1.0, max_new_tokens=env_cfg.max_new_tokens)
    limits = LoopLimits(max_turns=args.max_turns, max_new_tokens=env_cfg.max_new_tokens, max_episode_tokens=4096)

    def rollout(side: str, r: int) -> float:
        tasks = [Task(seed=10**6 + r * args.tasks + i) for i in range(args.tasks)]
        torch.manual_seed(r)
        t0 = time.perf_counter()
        episodes = collect(engines[side], processor, envs, tasks, args.samples, params, limits)
        return sum(len(e.segments) for e in episodes) / (time.perf_counter() - t0)

    rates: dict[str, dict[str, list[float]]] = {"sft": {s: [] for s in sides}, "rollout": {s: [] for s in sides}}
    for r in range(args.rounds):
        for side in sides:
            rates["sft"][side].append(sft_steps(side))
            with torch.no_grad():
                rates["rollout"][side].append(rollout(side, r))
            print(f"round {r} {side}: SFT {rates['sft'][side][-1]:.1f} states/s, "
                  f"rollout {rates['rollout'][side][-1]:.1f} turns/s", flush=True)

    print(f"\n{args.steps} SFT steps of {args.batch} states and {args.tasks} mazes x {args.samples} samples "
          f"(<= {args.max_turns} turns) per side per round, {args.rounds} rounds, {args.threads} thread(s), "
          f"train autocast: {autocast or 'float32'}, model: {'smoke' if args.smoke else path}\n")
    print("| work | per-image loop (median) | batched (median) | batched / loop |\n|---|---:|---:|---:|")
    for work, unit in (("sft", "states/s"), ("rollout", "turns/s")):
        a, b = (statistics.median(rates[work][s]) for s in sides)
        print(f"| {'SFT step' if work == 'sft' else 'rollout'} ({unit}) | {a:.1f} | {b:.1f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
