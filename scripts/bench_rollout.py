"""Rollout and training-step throughput of rlfw against two `model.generate` baselines.

All three sides use the same tiny_vl model and weights, the same mazes, the same prompts (rlfw's
history=none turn: current image, task text, last step's feedback) and the same sampling settings
(temperature, no top-k/top-p, banned tokens suppressed, the same EOS and token limits), measured in
the same process one after the other, so the ratios hold on a noisy shared machine. The baselines
are what a user would write with transformers:

- batched generate: all episodes at once; each turn the still-active episodes' prompts are
  left-padded into one batch for one `model.generate` call;
- per-episode generate: the same loop one episode at a time, so one `model.generate` call per
  episode per turn at batch size 1.

Same random streams: before each side torch's global RNG is reset with `torch.manual_seed(0)` and
the envs are reset to the same tasks (maze seeds), so every side starts from the same state. The
episodes themselves are not identical: the three implementations draw random numbers in different
orders and shapes (rlfw's own sampler over deduplicated prompts; `generate` over a padded batch or
a single row), so after the first sample the trajectories, and with them the episode lengths and
token counts, differ. That is why rates are given per episode and per generated token.

    python scripts/bench_rollout.py            # full sizes (a few minutes on 2 cores)
    python scripts/bench_rollout.py --smoke    # seconds; run by the test suite
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import AlgoConfig, MazeEnvConfig, ModelConfig, TinyVLSpec
from rlfw.distributed.workers import EngineWorker, PolicyWorker
from rlfw.models.processing import PolicyProcessor, collate
from rlfw.rollout.agent_loop import LoopLimits, collect, turn_message
from rlfw.rollout.types import Episode, SamplingParams, Task, TrainBatch

SIDES = ("rlfw", "batched generate", "per-episode generate")
HEADER = ["metric", *SIDES, "rlfw / batched", "rlfw / per-episode"]


def env_config(max_turns: int) -> MazeEnvConfig:
    return MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", max_turns=max_turns, cell_px=8)


def batched_generate_rollout(model, processor: PolicyProcessor, envs, tasks, n_samples, params, max_turns):
    """All episodes at once: each turn one `model.generate` call on the active episodes' prompts.

    Returns (episodes, generated tokens); a reply is cut after its EOS, which is counted.
    """
    n, eos = len(tasks) * n_samples, processor.eos_token_id
    obs = [envs[i].reset(**tasks[i // n_samples].reset_kwargs())[0] for i in range(n)]
    task_text, feedback = [o["text"] for o in obs], [""] * n
    active, tokens = list(range(n)), 0
    for _ in range(max_turns):
        ids = [processor.encode_message(turn_message(task_text[i], feedback[i]), [obs[i]["image"]])
               + processor.generation_prompt_ids for i in active]
        feats = [[processor.image_features(obs[i]["image"])] for i in active]
        batch = collate(ids, feats, processor.image_token_id, processor.pad_token_id, left_pad=True)
        out = model.generate(**batch, max_new_tokens=params.max_new_tokens, do_sample=True, top_k=0,
                             temperature=params.temperature, eos_token_id=eos,
                             pad_token_id=processor.pad_token_id, suppress_tokens=processor.banned_token_ids)
        still = []
        for i, row in zip(active, out[:, batch["input_ids"].shape[1]:].tolist()):
            new = row[: row.index(eos) + 1] if eos in row else row
            tokens += len(new)
            obs[i], _, terminated, truncated, _ = envs[i].step(processor.decode(new))
            feedback[i] = obs[i]["text"]
            if not (terminated or truncated):
                still.append(i)
        active = still
        if not active:
            break
    return n, tokens


def per_episode_generate_rollout(model, processor: PolicyProcessor, envs, tasks, n_samples, params, max_turns):
    """One `model.generate` call per episode per turn: the batched loop, one episode at a time."""
    runs = [batched_generate_rollout(model, processor, [envs[i]], [tasks[i // n_samples]], 1, params, max_turns)
            for i in range(len(tasks) * n_samples)]
    return len(runs), sum(tokens for _, tokens in runs)


def compare(engine: EngineWorker, processor: PolicyProcessor, n_tasks: int, n_samples: int, max_turns: int):
    """Time rlfw's `collect` and both baselines on the same mazes, each side from `torch.manual_seed(0)`.

    Returns {side: (seconds, episodes, generated tokens)} and rlfw's episodes.
    """
    env_cfg = env_config(max_turns)
    make_env = make_env_fn(env_cfg, processor.crop_px)  # the observations the policy reads
    envs = [make_env() for _ in range(n_tasks * n_samples)]
    tasks = [Task(seed=10**6 + i) for i in range(n_tasks)]
    params = SamplingParams(temperature=1.0, max_new_tokens=env_cfg.max_new_tokens)
    limits = LoopLimits(max_turns=max_turns, max_new_tokens=env_cfg.max_new_tokens, max_episode_tokens=4096)
    episodes: list[Episode] = []

    def rlfw():
        episodes.extend(collect(engine, processor, envs, tasks, n_samples, params, limits))
        return len(episodes), sum(e.generated_tokens for e in episodes)

    args = (engine.engine.model, processor, envs, tasks, n_samples, params, max_turns)
    runs = dict(zip(SIDES, (rlfw, lambda: batched_generate_rollout(*args),
                            lambda: per_episode_generate_rollout(*args))))
    results = {}
    for side, run in runs.items():
        torch.manual_seed(0)
        t0 = time.perf_counter()
        n, tokens = run()
        results[side] = (time.perf_counter() - t0, n, tokens)
    return results, episodes


def rows(results: dict, update_s: float | None = None) -> list[tuple[str, ...]]:
    """Table rows in HEADER's columns; each ratio is rlfw's speed-up over that baseline."""
    seconds, n, tokens = zip(*(results[side] for side in SIDES))
    measures = [("episodes/s", [e / s for e, s in zip(n, seconds)]),
                ("generated tokens/s", [t / s for t, s in zip(tokens, seconds)])]
    if update_s is not None:
        measures.append(("s per training step (rollout + update)", [s + update_s for s in seconds]))
    out = []
    for name, (ours, *theirs) in measures:
        ratios = [t / ours if name.startswith("s per") else ours / t for t in theirs]
        out.append((name, *(f"{v:.2f}" for v in (ours, *theirs)), *(f"{r:.1f}x" for r in ratios)))
    return out


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

    spec = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128) if args.smoke else TinyVLSpec()
    model_cfg = ModelConfig(name="tiny_vl", tiny=spec)
    tmp = Path(tempfile.mkdtemp(prefix="rlfw-bench-"))
    path = prepare_base_model(model_cfg, make_env_fn(env_config(args.max_turns)), tmp, seed=0)
    engine = EngineWorker(model_cfg, path, torch_threads=args.threads)
    processor = PolicyProcessor.from_pretrained(path)
    results, eps = compare(engine, processor, args.tasks, args.samples, args.max_turns)

    algo = AlgoConfig(name="grpo", tasks_per_step=args.tasks, tasks_per_optimizer_step=args.tasks, sequences_per_forward=16)
    policy = PolicyWorker(model_cfg, algo, path, total_steps=10, seed=0, torch_threads=args.threads)
    segments = [s for e in eps for s in e.segments]
    groups = [e.group_id for e in eps for _ in e.segments]
    adv = [1.0 if i % 2 else -1.0 for i in range(len(segments))]
    t0 = time.perf_counter()
    policy.update(TrainBatch(segments, adv, groups), step=1)
    t_update = time.perf_counter() - t0

    print(f"\n{len(eps)} episodes ({args.tasks} mazes x {args.samples}), max_turns={args.max_turns}, "
          f"{sum(p.numel() for p in engine.engine.model.parameters()) / 1e6:.1f}M params, {args.threads} thread(s)\n")
    print("| " + " | ".join(HEADER) + " |\n|---|" + "---:|" * (len(HEADER) - 1))
    for row in rows(results, t_update):
        print("| " + " | ".join(row) + " |")
    sizes = " --smoke" if args.smoke else f" --tasks {args.tasks} --samples {args.samples} --max-turns {args.max_turns}"
    print(f"\ncommand: python scripts/bench_rollout.py{sizes}" + (f" --threads {args.threads}" if args.threads != 1 else ""))


if __name__ == "__main__":
    main()
