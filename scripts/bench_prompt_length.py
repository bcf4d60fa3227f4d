"""What a shorter prompt would buy: one SFT step at the real prompt length against the same step
with most of the task text's tokens cut, on the shipped checkpoint, in one run.

A maze state is 98 tokens: 49 image tokens, about 38 tokens of VisGym's task text (the action menu
alone is about 30) and the chat frame. A tokenizer with one token per prompt line would keep the
text and cut about 30 tokens. This measures the step-time ratio that would give, without building
that tokenizer: the cut sequences are not a prompt the model knows, only the same shapes.

    python scripts/bench_prompt_length.py            # about a minute on 2 cores
    python scripts/bench_prompt_length.py --cut 30 --steps 6
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfw.build import build_policy_model, make_env_fn  # noqa: E402
from rlfw.config import LoraConfig, MazeEnvConfig, ModelConfig  # noqa: E402
from rlfw.rollout.types import Segment  # noqa: E402
from rlfw.rollout.demos import DemoSampler, to_segment  # noqa: E402
from rlfw.sft import sft_loss  # noqa: E402

SHIPPED = ROOT / "checkpoints" / "tiny_vl_maze_sft"


def cut_text(s: Segment, vision_end: int, n: int) -> Segment:
    """`s` without the `n` tokens that follow the image (the start of the task text)."""
    i = s.token_ids.index(vision_end) + 1
    ids = s.token_ids[:i] + s.token_ids[i + n:]
    return Segment(ids, s.loss_mask[:i] + s.loss_mask[i + n:], [0.0] * len(ids), s.images)


def median_step(model, processor, optimizer, batches: list[list[Segment]]) -> float:
    """Median seconds of an SFT step (forward, backward, AdamW) over `batches`, the first as warm-up."""
    times = []
    for segments in batches:
        t0 = time.perf_counter()
        loss = sft_loss(model, processor, segments)[0]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    rest = sorted(times[1:])
    return rest[len(rest) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cut", type=int, default=30, help="task-text tokens to drop per state")
    ap.add_argument("--batch", type=int, default=64, help="states per step (the SFT preset's batch)")
    ap.add_argument("--steps", type=int, default=6, help="steps per setting, the first a warm-up")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, processor = build_policy_model(ModelConfig(name="tiny_vl", lora=LoraConfig(rank=0)), str(SHIPPED))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    sampler = DemoSampler(make_env_fn(MazeEnvConfig(name="maze", id="rlfw/Maze2D-v0", cell_px=8), processor.crop_px), seed=0,
                          mode="all_squares", noise=0.0)
    full = [[to_segment(processor, *state) for state in sampler.sample(args.batch)] for _ in range(args.steps)]
    vision_end = processor.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    short = [[cut_text(s, vision_end, args.cut) for s in b] for b in full]
    t_full = median_step(model, processor, optimizer, full)
    t_short = median_step(model, processor, optimizer, short)
    n_full = sum(len(s.token_ids) for s in full[0]) / args.batch
    n_short = sum(len(s.token_ids) for s in short[0]) / args.batch
    print(f"| prompt | tokens per state | s per {args.batch}-state SFT step | states/s |")
    print("|---|---:|---:|---:|")
    print(f"| as used | {n_full:.0f} | {t_full:.3f} | {args.batch / t_full:.0f} |")
    print(f"| {args.cut} text tokens cut | {n_short:.0f} | {t_short:.3f} | {args.batch / t_short:.0f} |")
    print(f"speed-up from the shorter prompt: {t_full / t_short:.2f}x (torch threads: {args.threads})")


if __name__ == "__main__":
    main()
