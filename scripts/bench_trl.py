"""Throughput of one full GRPO step (generation + update) of rlfw against TRL's `GRPOTrainer`.

Both sides train the same policy on the same single-turn task, `rlfw/MazeStep-v0`: one maze image
with the agent on a random open square of a training maze, Maze2D's task text as the prompt, reward
1.0 when the reply names a move on a shortest path to the target. Both get the same tasks in the
same order (step k: prompts k*B .. k*B+B-1, each sampled G times) and build their prompts and
rewards with that env. The settings match as far as the two frameworks allow:

- model: the same checkpoint folder, float32, the same PEFT LoRA (rank, alpha, target modules);
- prompts: token ids checked identical (rlfw's message-at-a-time encoding vs TRL's processor), and
  the same pixels (TRL is fed the env's images, cropped by the env as for rlfw's policy, through the same
  Qwen2-VL image processor);
- sampling: temperature 1.0, top_p 1.0, no top-k, the same max completion length, stop at
  `<|im_end|>`, the same suppressed tokens;
- update: one optimizer step per training step on fresh samples (on-policy, so neither side runs
  an extra old-log-prob pass), no KL (no reference pass), token-mean loss, clip 0.2, group-std
  advantages, AdamW at the same LR with clipping at 1.0, the same micro-batch size
  (rlfw `sequences_per_forward` = TRL `per_device_train_batch_size`, accumulated over B*G samples),
  no gradient checkpointing on either side (TRL turns it on by default), 1 torch thread.

A step is everything a training step does. rlfw (as `rlfw.train` does it, workers in-process as
in `scripts/bench_rollout.py`): seed the engine, `collect` B*G one-turn episodes in one batched
`generate`, GRPO advantages, `PolicyWorker.update`, then publish the adapter and load it into the
engine. TRL: one iteration of `GRPOTrainer.train()`, timed between consecutive `on_step_end`
callbacks (generation, reward, advantages, B*G/micro accumulation steps, optimizer step, its own
per-step logging). The first step of each side is a warm-up and is not timed. The two sides run
one after the other in the same process, so on a shared machine the ratio is the number to read.

Not all of the difference is overhead. rlfw shares work that TRL repeats: its engine prefills each
distinct prompt once for its G samples (with the LoRA merged into the weights), and its trainer
runs one forward/backward row per distinct sample (a prompt and reply pair; with one-token
actions a group holds few), both exact. The trainer's sharing can be switched off, so the table
also has a "rlfw, no dedup" row, and the header says how many prompts and samples were distinct.

    python scripts/bench_trl.py            # shipped checkpoint, 8 prompts x 8, 3 timed steps
    python scripts/bench_trl.py --smoke    # a tiny random model, 2 x 2, 1 timed step (the tests)

TRL is an optional extra (`pip install -e ".[bench]"`); without it only the rlfw row is printed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from transformers.utils.logging import disable_progress_bar

from rlfw.build import make_env_fn, prepare_base_model
from rlfw.config import AlgoConfig, LoraConfig, MazeEnvConfig, ModelConfig, TinyVLSpec
from rlfw.models.processing import PolicyProcessor
from rlfw.rollout.agent_loop import LoopLimits, turn_message
from rlfw.rollout.types import Prompt, SamplingParams, Task, prompt_key, segment_key

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "tiny_vl_maze_sft"
ENV_ID = "rlfw/MazeStep-v0"
TRL_MISSING = 'TRL is not installed: pip install -e ".[bench]" (trl==1.16.0) to benchmark it; TRL row skipped.'


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 2 prompts x 2, 1 timed step")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (B)")
    ap.add_argument("--generations", type=int, default=8, help="samples per prompt (G, the group size)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    ap.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward pass")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=str(CHECKPOINT), help="checkpoint folder (ignored with --smoke)")
    args = ap.parse_args()
    if args.smoke:
        args.prompts, args.generations, args.steps = 2, 2, 1
    n = args.prompts * args.generations
    args.micro_batch = min(args.micro_batch, n)
    if n % args.micro_batch:
        ap.error(f"--micro-batch {args.micro_batch} must divide prompts x generations = {n}")
    return args


# -- shared setup ----------------------------------------------------------------------------------
def setup(args, tmp: Path) -> tuple[str, MazeEnvConfig, ModelConfig, AlgoConfig]:
    """The env config, the model (the shipped checkpoint, or a tiny random one) and the algorithm."""
    env_cfg = MazeEnvConfig(name="maze_step", id=ENV_ID, cell_px=8)  # max_turns=20: Maze2D's prompt
    lora = LoraConfig(rank=16, alpha=32)
    if args.smoke:
        spec = TinyVLSpec(num_layers=1, hidden_size=64, intermediate_size=128, image_crop_px=8)
        path = prepare_base_model(ModelConfig(name="tiny_vl", tiny=spec, lora=lora), make_env_fn(env_cfg), tmp, seed=0)
    else:
        path = args.model
    model_cfg = ModelConfig(name="bench", path=path, lora=lora)
    algo = AlgoConfig(name="grpo", n_samples_per_prompt=args.generations, tasks_per_step=args.prompts,
                      tasks_per_optimizer_step=args.prompts, sequences_per_forward=args.micro_batch, temperature=1.0)
    return path, env_cfg, model_cfg, algo


def step_tasks(n_steps: int, n_prompts: int, seed: int = 0) -> list[list[Task]]:
    """Each step's prompts: MazeStep states from training seeds (`envs.eval_sets.TRAIN_SEEDS`)."""
    from envs.eval_sets import TRAIN_SEEDS

    seeds = np.random.default_rng(seed).integers(TRAIN_SEEDS.start, TRAIN_SEEDS.stop, size=(n_steps, n_prompts))
    return [[Task(seed=int(s)) for s in row] for row in seeds]


def summary(name: str, times: list[float], samples: int, rewards: list, tokens: list) -> dict:
    """One side's timed steps; reward and completion length are means over the same steps."""
    return {"side": name, "times": times, "samples": samples, "reward": float(np.mean(rewards)),
            "tokens": float(np.mean(tokens))}


# -- rlfw ------------------------------------------------------------------------------------------
def run_rlfw(args, path: str, env_cfg: MazeEnvConfig, model_cfg: ModelConfig, algo: AlgoConfig,
             tasks: list[list[Task]], tmp: Path, dedup: bool = True) -> dict | None:
    """Warm-up + timed steps of rlfw's training step (as in `rlfw.train`), its workers in-process."""
    from rlfw.algos import get_adv_est
    from rlfw.distributed.workers import EngineWorker, PolicyWorker
    from rlfw.rollout.agent_loop import collect
    from rlfw.train import rewards_and_groups, train_batch

    engine = EngineWorker(model_cfg, path, torch_threads=args.threads)
    policy = PolicyWorker(model_cfg, algo, path, total_steps=len(tasks), seed=0, torch_threads=args.threads)
    if hasattr(policy.trainer, "dedup"):
        policy.trainer.dedup = dedup
    elif not dedup:
        return None  # this rlfw has no duplicate sharing to switch off
    processor = PolicyProcessor.from_pretrained(path)
    make_env = make_env_fn(env_cfg, processor.crop_px)
    envs = [make_env() for _ in range(args.prompts * args.generations)]
    params = SamplingParams(temperature=algo.temperature, top_p=algo.top_p, max_new_tokens=env_cfg.max_new_tokens)
    limits = LoopLimits(max_turns=1, max_new_tokens=env_cfg.max_new_tokens,
                        max_episode_tokens=env_cfg.max_episode_tokens)
    adv_fn, sync_root = get_adv_est(algo.advantage_estimator), str(tmp / f"lora_sync_{dedup}")
    policy.save_weights(sync_root, 0)
    engine.load_weights(sync_root)

    times, rewards, tokens, prompts, samples = [], [], [], [], []
    for step, step_tasks_ in enumerate(tasks, start=1):
        t0 = time.perf_counter()
        engine.set_seed(step)
        episodes = collect(engine, processor, envs, step_tasks_, args.generations, params, limits)
        reward, groups = rewards_and_groups(episodes)
        engine.sleep()
        policy.update(train_batch(episodes, adv_fn(reward, groups), algo), step, seed=step)
        engine.wake_up()
        policy.save_weights(sync_root, step)
        engine.load_weights(sync_root)
        times.append(time.perf_counter() - t0)
        rewards.append(reward.tolist())
        tokens.append([e.generated_tokens for e in episodes])
        segments = [s for e in episodes for s in e.segments]
        prompts.append(len({prompt_key(Prompt(s.token_ids[:s.loss_mask.index(1)], s.images)) for s in segments}))
        samples.append(len({segment_key(s) for s in segments}))
    out = summary("rlfw" if dedup else "rlfw, no dedup", times[1:], len(envs), rewards[1:], tokens[1:])
    out["distinct"] = (float(np.mean(prompts[1:])), float(np.mean(samples[1:])))
    out["params"] = sum(p.numel() for n, p in engine.engine.model.named_parameters() if "lora_" not in n) / 1e6
    return out


# -- TRL -------------------------------------------------------------------------------------------
def trl_processor(path: str):
    """An HF processor (a `ProcessorMixin`, which TRL needs for a VLM) over rlfw's tokenizer and image
    processor; the checkpoint's chat template renders exactly rlfw's prompt ids (checked in `main`).

    `Qwen3VLProcessor` requires a video processor, and transformers builds video processors with
    torchvision, which this CPU install does not have, so the subclass takes none.
    """
    from transformers import ProcessorMixin, Qwen3VLProcessor

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            for name in ("image", "video", "vision_start", "vision_end"):
                token = getattr(tokenizer, f"{name}_token")
                setattr(self, f"{name}_token", token)
                setattr(self, f"{name}_token_id", tokenizer.convert_tokens_to_ids(token))

    pp = PolicyProcessor.from_pretrained(path)  # a fresh tokenizer: TRL may set attributes on it
    return ImageOnlyQwen3VLProcessor(pp.image_processor, pp.tokenizer, chat_template=pp.tokenizer.chat_template), pp


def trl_dataset(env_cfg: MazeEnvConfig, tasks: list[list[Task]], crop: int):
    """One row per prompt, in step order: the conversational prompt, the cropped image, the state."""
    from datasets import Dataset
    from PIL import Image

    env = make_env_fn(env_cfg, crop)()
    rows = {"prompt": [], "image": [], "layout": []}
    for task in (t for step in tasks for t in step):
        obs, _ = env.reset(seed=task.seed)
        rows["prompt"].append([{"role": "user", "content": obs["text"]}])
        rows["image"].append(Image.fromarray(obs["image"]))
        rows["layout"].append(json.dumps(env.unwrapped.layout()))
    return Dataset.from_dict(rows)


def maze_reward(env_cfg: MazeEnvConfig):
    """TRL reward function: replay each sample's state in the env and step it with the reply."""
    env = make_env_fn(env_cfg)()

    def maze_step_reward(completions, layout, **_) -> list[float]:
        out = []
        for completion, record in zip(completions, layout):
            env.reset(options={"layout": json.loads(record)})
            out.append(float(env.step(completion[-1]["content"])[1]))
        return out

    return maze_step_reward


def check_same_prompt(processor, pp: PolicyProcessor, env_cfg: MazeEnvConfig, task: Task) -> None:
    """Fail unless TRL's processor gives the prompt ids and pixels rlfw's rollout gives."""
    from PIL import Image

    obs, _ = make_env_fn(env_cfg, pp.crop_px)().reset(seed=task.seed)
    rlfw_ids = pp.encode_message(turn_message(obs["text"], ""), [obs["image"]]) + pp.generation_prompt_ids
    image = Image.fromarray(obs["image"])
    conv = [[{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": obs["text"]}]}]]
    out = processor.apply_chat_template(conversation=conv, add_generation_prompt=True, tokenize=True, return_dict=True)
    same_pixels = np.array_equal(np.asarray(out["pixel_values"]), pp.image_features(obs["image"]).pixel_values.numpy())
    if list(out["input_ids"][0]) != rlfw_ids or not same_pixels:
        raise AssertionError("TRL's prompt differs from rlfw's: the comparison would not be like for like")


def run_trl(args, path: str, env_cfg: MazeEnvConfig, model_cfg: ModelConfig, algo: AlgoConfig,
            tasks: list[list[Task]], tmp: Path) -> dict | None:
    """Warm-up + timed steps of `GRPOTrainer.train()`, or None when TRL is not installed."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from transformers import PrinterCallback, ProgressCallback, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        print(TRL_MISSING)
        return None
    from rlfw.models import load_policy

    class StepClock(TrainerCallback):
        """Wall time at the end of every optimizer step, each step's logged metrics, torch threads."""

        def __init__(self):
            self.ends, self.logs, self.threads = [], [], set()

        def on_train_begin(self, *_, **__):
            self.ends.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())
            self.threads.add(torch.get_num_threads())

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                self.logs.append(logs)

    torch.set_num_threads(args.threads)
    processor, pp = trl_processor(path)
    check_same_prompt(processor, pp, env_cfg, tasks[0][0])
    model, _ = load_policy(path, model_cfg.dtype)
    lora = model_cfg.lora
    peft_config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                 target_modules=list(lora.target_modules), bias="none")
    n = args.prompts * args.generations
    config = GRPOConfig(
        output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, report_to="none", disable_tqdm=True,
        save_strategy="no", logging_steps=1, seed=0, max_steps=len(tasks), shuffle_dataset=False,
        num_generations=args.generations, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=n // args.micro_batch,  # -> generation batch = B*G, one optimizer step
        max_completion_length=env_cfg.max_new_tokens, temperature=algo.temperature, top_p=algo.top_p, top_k=0,
        generation_kwargs={"suppress_tokens": pp.banned_token_ids},
        learning_rate=algo.lr, lr_scheduler_type="constant", weight_decay=algo.weight_decay,
        max_grad_norm=algo.max_grad_norm, optim="adamw_torch",
        beta=0.0, num_iterations=1, epsilon=algo.eps_clip_low, loss_type="dapo", scale_rewards="group",
        gradient_checkpointing=False,
    )
    clock = StepClock()
    trainer = GRPOTrainer(model=model, reward_funcs=maze_reward(env_cfg), args=config, processing_class=processor,
                          train_dataset=trl_dataset(env_cfg, tasks, pp.crop_px), peft_config=peft_config,
                          callbacks=[clock])
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    assert trainer.args.generation_batch_size == n, trainer.args.generation_batch_size
    trainer.train()
    if clock.threads != {args.threads}:
        print(f"warning: TRL ran with torch threads {sorted(clock.threads)}, not {args.threads}")
    times = np.diff(clock.ends).tolist()
    rewards = [log["reward"] for log in clock.logs]
    tokens = [log["completions/mean_length"] for log in clock.logs]
    return summary("TRL", times[1:], n, rewards[1:], tokens[1:])


# -- report ----------------------------------------------------------------------------------------
def report(args, path: str, model_cfg: ModelConfig, env_cfg: MazeEnvConfig, results: list[dict]) -> None:
    n, lora, first = args.prompts * args.generations, model_cfg.lora, results[0]
    print(f"\none GRPO step = {args.prompts} prompts x {args.generations} generations = {n} samples of {ENV_ID}; "
          f"model {Path(path).name} ({first['params']:.1f}M params, LoRA r{lora.rank} alpha{lora.alpha}); "
          f"max completion {env_cfg.max_new_tokens} tokens, temperature 1.0; micro-batch {args.micro_batch}; "
          f"{args.threads} torch thread(s); means over {args.steps} timed step(s) after 1 warm-up")
    prompts, samples = first["distinct"]
    print(f"per step, distinct prompts: {prompts:.1f} of {n} (rlfw prefills each once), distinct prompt+reply "
          f"samples: {samples:.1f} of {n} (rlfw's trainer forwards each once unless 'no dedup')\n")
    print("| side | samples/s | s/step | min s/step | mean reward | completion tokens/sample |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        mean = float(np.mean(r["times"]))
        print(f"| {r['side']} | {r['samples'] / mean:.2f} | {mean:.2f} | {min(r['times']):.2f} | "
              f"{r['reward']:.3f} | {r['tokens']:.2f} |")
    trl = [r for r in results if r["side"] == "TRL"]
    print()
    for r in results:
        if trl and r is not trl[0]:
            print(f"{r['side']} / TRL samples/s: {np.mean(trl[0]['times']) / np.mean(r['times']):.2f}x")
    print(f"\ncommand: python scripts/bench_trl.py{' --smoke' if args.smoke else ''}"
          f"{f' --threads {args.threads}' if args.threads != 1 else ''}")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers renames, raised inside TRL
    with tempfile.TemporaryDirectory(prefix="rlfw-bench-trl-") as tmp:
        path, env_cfg, model_cfg, algo = setup(args, Path(tmp))
        tasks = step_tasks(1 + args.steps, args.prompts)
        results = [run_rlfw(args, path, env_cfg, model_cfg, algo, tasks, Path(tmp)),
                   run_rlfw(args, path, env_cfg, model_cfg, algo, tasks, Path(tmp), dedup=False),
                   run_trl(args, path, env_cfg, model_cfg, algo, tasks, Path(tmp))]
        report(args, path, model_cfg, env_cfg, [r for r in results if r is not None])


if __name__ == "__main__":
    main()
