"""Rollout and training-step throughput of rlfw against a naive per-episode `model.generate` loop.

Both sides use the same tiny_vl model, the same mazes (same seeds) and the same sampling settings,
measured in the same process one after the other, so the ratios hold on a noisy shared machine.
The naive baseline is what a user would write with transformers: for each episode, for each turn,
encode the conversation and call `model.generate` on it alone.

    python scripts/bench_rollout.py            # full sizes (a few minutes on 2 cores)
    python scripts/bench_rollout.py --smoke    # seconds; run by the test suite
"""

from __future__ import annotations

import argparse
import time

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import AlgoConfig, MazeEnvConfig, ModelConfig
from rlfw.distributed.workers import EngineWorker, PolicyWorker
from rlfw.models.processing import PolicyProcessor, collate
from rlfw.config import TinyVLSpec
from rlfw.rollout.agent_loop import LoopLimits, collect
from rlfw.rollout.types import SamplingParams, Task, TrainBatch


def naive_rollout(model, processor: PolicyProcessor, envs, tasks, n_samples, params, max_turns):
    """One `model.generate` call per episode per turn."""
    tokens, episodes = 0, 0
    for i in range(len(tasks) * n_samples):
        env, task = envs[i], tasks[i // n_samples]
        obs, _ = env.reset(**task.reset_kwargs())
        prompt_text, feedback = obs["text"], ""
        for _ in range(max_turns):
            text = prompt_text if not feedback else f"{prompt_text}\n{feedback}"
            feats = [processor.image_features(obs["image"])]
            ids = processor.encode_message({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]},
                                           [obs["image"]]) + processor.generation_prompt_ids
            batch = collate([ids], [feats], processor.image_token_id, processor.pad_token_id, left_pad=True)
            out = model.generate(**batch, max_new_tokens=params.max_new_tokens, do_sample=True, top_k=0,
                                 temperature=params.temperature, eos_token_id=processor.eos_token_id,
                                 pad_token_id=processor.pad_token_id, suppress_tokens=processor.banned_token_ids)
            new = out[0, batch["input_ids"].shape[1]:].tolist()
            tokens += len(new)
            obs, _, terminated, truncated, _ = env.step(processor.decode(new))
            feedback = obs["text"]
            if terminated or truncated:
                break
        episodes += 1
    return episodes, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.smoke:
        args.tasks, args.samples, args.max_turns = 2, 2, 2
    torch.set_num_threads(args.threads)

    env_cfg = MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=args.max_turns, cell_px=8)
    make_env = make_env_fn(env_cfg)
    spec = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128) if args.smoke else TinyVLSpec()
    model_cfg = ModelConfig(name="tiny_vl", tiny=spec)
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp(prefix="rlfw-bench-"))
    path = prepare_base_model(model_cfg, make_env, tmp, seed=0)
    engine = EngineWorker(model_cfg, path, torch_threads=args.threads)
    processor = PolicyProcessor.from_pretrained(path)
    n = args.tasks * args.samples
    envs = [make_env() for _ in range(n)]
    tasks = [Task(seed=10**6 + i) for i in range(args.tasks)]
    params = SamplingParams(temperature=1.0, max_new_tokens=env_cfg.max_new_tokens)
    limits = LoopLimits(max_turns=args.max_turns, max_new_tokens=env_cfg.max_new_tokens, max_episode_tokens=4096)

    torch.manual_seed(0)
    t0 = time.perf_counter()
    eps = collect(engine, processor, envs, tasks, args.samples, params, limits)
    t_rlfw = time.perf_counter() - t0
    tok_rlfw = sum(e.generated_tokens for e in eps)

    torch.manual_seed(0)
    t0 = time.perf_counter()
    n_naive, tok_naive = naive_rollout(engine.engine.model, processor, envs, tasks, args.samples, params, args.max_turns)
    t_naive = time.perf_counter() - t0

    algo = AlgoConfig(name="grpo", train_batch_size=args.tasks, mini_batch_size=args.tasks, micro_batch_size=16)
    policy = PolicyWorker(model_cfg, algo, path, total_steps=10, seed=0, torch_threads=args.threads)
    segments = [s for e in eps for s in e.segments]
    groups = [e.group_id for e in eps for _ in e.segments]
    adv = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
    t0 = time.perf_counter()
    policy.update(TrainBatch(segments, adv, groups))
    t_update = time.perf_counter() - t0

    rows = [
        ("episodes/s", len(eps) / t_rlfw, n_naive / t_naive),
        ("generated tokens/s", tok_rlfw / t_rlfw, tok_naive / t_naive),
        ("s per training step (rollout + update)", t_rlfw + t_update, t_naive + t_update),
    ]
    print(f"\n{n} episodes ({args.tasks} mazes x {args.samples}), max_turns={args.max_turns}, "
          f"{sum(p.numel() for p in engine.engine.model.parameters()) / 1e6:.1f}M params, {args.threads} thread(s)\n")
    print("| metric | rlfw | naive generate loop | rlfw / naive |")
    print("|---|---:|---:|---:|")
    for name, a, b in rows:
        ratio = b / a if name.startswith("s per") else a / b
        print(f"| {name} | {a:.2f} | {b:.2f} | {ratio:.1f}x |")
    print(f"\ncommand: python scripts/bench_rollout.py{' --smoke' if args.smoke else ''}")


if __name__ == "__main__":
    main()
