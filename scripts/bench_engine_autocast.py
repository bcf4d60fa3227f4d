"""rlfw's transformers engine in float32 against the same engine under bf16 autocast
(`model.engine_autocast=bfloat16`), on the RL stage's own work: sampled multi-turn maze rollouts
from a maze policy with a LoRA r32 adapter merged in, as GRPO collects them.

Both engines load the same weights in one process. The sides alternate (A B A B ...), each round
from `torch.manual_seed(0)` and the same mazes, so a noisy machine slows both alike; the table gives
each side's median over the rounds and the ratio. Sampled trajectories differ between the sides
once a bf16 logit tips a draw, so the rates are per generated turn. Beside the speed, on the first
turn of `--agree` mazes: how often the two pick the same greedy move, and the largest difference
between their log-probs of a move both picked.

    python scripts/bench_engine_autocast.py                       # the shipped SFT checkpoint
    python scripts/bench_engine_autocast.py --model <folder> --rounds 3 --threads 2
    python scripts/bench_engine_autocast.py --smoke               # a random tiny policy, seconds
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig, TinyVLSpec
from rlfw.distributed.workers import EngineWorker
from rlfw.models import native_bf16
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits, collect, turn_message
from rlfw.rollout.types import Prompt, SamplingParams, Task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="checkpoints/tiny_vl_maze_sft", help="a policy folder")
    ap.add_argument("--tasks", type=int, default=8, help="mazes per rollout batch")
    ap.add_argument("--samples", type=int, default=8, help="episodes per maze")
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side, alternating")
    ap.add_argument("--agree", type=int, default=256, help="mazes for the greedy agreement check")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the engine worker's count in a run)")
    ap.add_argument("--smoke", action="store_true", help="a random tiny policy and tiny sizes")
    args = ap.parse_args()
    if args.smoke:
        args.tasks, args.samples, args.max_turns, args.rounds, args.agree = 2, 2, 2, 1, 4
    torch.set_num_threads(args.threads)

    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=args.max_turns)
    lora = LoraConfig(rank=32, alpha=64)
    if args.smoke:
        spec = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128)
        path = prepare_base_model(ModelConfig(name="tiny_vl", tiny=spec), make_env_fn(env_cfg),
                                  Path(tempfile.mkdtemp(prefix="rlfw-bench-")), seed=0)
    else:
        path = args.model
    engines = {}
    for side, autocast in (("float32", None), ("bf16 autocast", "bfloat16")):
        torch.manual_seed(0)  # the same LoRA init on both sides (B is zero, so the adapter is a no-op until trained)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engines[side] = EngineWorker(ModelConfig(name="tiny_vl", path=path, lora=lora, engine_autocast=autocast),
                                         path, torch_threads=args.threads)
    processor = PolicyProcessor.from_pretrained(path)
    make_env = make_env_fn(env_cfg, processor.crop_px)
    envs = [make_env() for _ in range(args.tasks * args.samples)]
    params = SamplingParams(temperature=1.0, max_new_tokens=env_cfg.max_new_tokens)
    limits = LoopLimits(max_turns=args.max_turns, max_new_tokens=env_cfg.max_new_tokens, max_episode_tokens=4096)

    rates: dict[str, list[float]] = {side: [] for side in engines}
    for r in range(args.rounds):
        tasks = [Task(seed=10**6 + r * args.tasks + i) for i in range(args.tasks)]
        for side, engine in engines.items():
            torch.manual_seed(0)
            engine.set_seed(r)
            t0 = time.perf_counter()
            episodes = collect(engine, processor, envs, tasks, args.samples, params, limits)
            seconds = time.perf_counter() - t0
            turns = sum(len(e.segments) for e in episodes)
            rates[side].append(turns / seconds)
            print(f"round {r} {side}: {turns} turns in {seconds:.1f} s", flush=True)

    env, prompts = make_env(), []
    for seed in range(2 * 10**6, 2 * 10**6 + args.agree):
        obs, _ = env.reset(seed=seed)
        ids = processor.encode_message(turn_message(obs["text"], ""), [obs["image"]]) + processor.generation_prompt_ids
        prompts.append(Prompt(ids, [obs["image"]]))
    greedy = SamplingParams(max_new_tokens=env_cfg.max_new_tokens, greedy=True)
    a, b = (engines[side].generate(prompts, greedy) for side in engines)
    same = [x.token_ids == y.token_ids for x, y in zip(a, b)]
    diff = max((abs(u - v) for x, y, s in zip(a, b, same) if s for u, v in zip(x.logprobs, y.logprobs)), default=0.0)

    med = {side: statistics.median(v) for side, v in rates.items()}
    print(f"\n{args.tasks} mazes x {args.samples} samples, <= {args.max_turns} turns, {args.rounds} rounds a side, "
          f"{args.threads} thread(s), native bf16: {native_bf16('cpu')}, model: {'smoke' if args.smoke else path}\n")
    print("| engine | generated turns/s (median) | rounds | vs float32 |\n|---|---:|---|---:|")
    for side, v in rates.items():
        print(f"| {side} | {med[side]:.1f} | {', '.join(f'{x:.1f}' for x in v)} | {med[side] / med['float32']:.2f}x |")
    print(f"\nfirst turns of {len(prompts)} mazes, greedy: the same reply on {sum(same)} "
          f"({sum(same) / len(same):.1%}); largest log-prob difference on those: {diff:.4f}")


if __name__ == "__main__":
    main()
