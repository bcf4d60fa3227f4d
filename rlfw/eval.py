"""Evaluate a trained policy: `python -m rlfw.eval model.path=<folder> [eval.adapter=<folder>]`.

The policy plays each evaluation set through the same agent loop and metrics as in-training
evaluation (`rlfw.evaluate.play`, `episode_metrics`, `save_episodes`): greedy by default, so a
model folder scores here what `rlfw.sft` or `rlfw.run` recorded for it. With `eval.n=k
eval.temperature=T` it samples k episodes per maze and reports pass@1 (the mean success) and pass@k
(the fraction of mazes solved at least once). The policy is a model folder evaluated as it is
(model.lora is not applied: a fresh adapter would only add zeros), or a model folder plus a PEFT
adapter (`eval.adapter=`: an rlfw.run export `exports/global_step_N/` or a `lora_sync/vN/`).

    python -m rlfw.eval                                             # the shipped checkpoint on eval64
    python -m rlfw.eval model.path=outputs/<sft run>/checkpoint eval.sets=[eval64,heldout]
    python -m rlfw.eval eval.adapter=outputs/<run>/exports/global_step_400 eval.n=8 eval.temperature=1
    python -m rlfw.eval eval.layouts=my_mazes.json                  # only the mazes of a file
    python -m rlfw.eval eval.base_url=http://127.0.0.1:8000/v1 eval.model=tiny_vl_maze_sft:grpo  # a served adapter

Writes `<eval.output_dir>/metrics.json` (every set's metrics, the policy, the command),
`config.yaml`, and per set `<set>/episodes.jsonl` and the first `eval.save_gifs` episodes as GIFs;
prints a Markdown table of the results.
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlfw.config import EvalRunConfig, register_configs
from rlfw.validation import validate_eval

register_configs()


def build_policy_engine(cfg: EvalRunConfig, model_path: str):
    """The policy under evaluation as an inference engine, with its processor and a description
    for metrics.json.

    Three sources: a model folder as it is, a model folder with `eval.adapter` loaded by PEFT
    (merged into the weights for inference, as the rollout engines do), or an OpenAI-compatible
    endpoint (`eval.base_url`, `eval.model`), where model.path gives only the tokenizer and the
    observation crop.
    """
    import os

    from rlfw.models import load_policy
    from rlfw.models.processing import PolicyProcessor
    from rlfw.rollout.engine import TransformersEngine

    v = cfg.eval
    if v.base_url:
        from rlfw.rollout.openai_engine import OpenAIEngine

        processor = PolicyProcessor.from_pretrained(model_path)
        engine = OpenAIEngine(v.base_url, v.model, processor, concurrency=v.concurrency,
                              api_key=os.environ.get(v.api_key_env))
        return engine, processor, {"model": v.model, "base_url": v.base_url, "adapter": None,
                                   "tokenizer": str(Path(model_path).resolve())}
    model, processor = load_policy(model_path, cfg.model.dtype)
    policy = {"model": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
              "adapter": None}
    if v.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, v.adapter)
        adapter_cfg = json.loads((Path(v.adapter) / "adapter_config.json").read_text())
        policy.update(adapter=str(Path(v.adapter).resolve()), adapter_base=adapter_cfg.get("base_model_name_or_path"),
                      adapter_rank=adapter_cfg.get("r"))
    engine = TransformersEngine(model.requires_grad_(False), processor, max_batch_size=v.batch_size, device=v.device,
                                autocast=cfg.model.engine_autocast)
    return engine, processor, policy


def evaluation_sets(cfg: EvalRunConfig) -> dict[str, tuple[list, list[dict] | None]]:
    """{set name: (tasks, layouts)}: the named sets, then the layouts file named after its stem."""
    from envs.eval_sets import load_layout_file

    from rlfw.build import eval_set_names, eval_tasks
    from rlfw.rollout.types import Task

    v = cfg.eval
    sets = {name: eval_tasks(cfg.env, name, v.heldout_size) for name in eval_set_names(v)}
    if v.layouts:
        layouts = load_layout_file(v.layouts)
        tasks = [Task(seed=int(r.get("seed", i)), layout=r) for i, r in enumerate(layouts)]
        sets[Path(v.layouts).stem] = tasks, layouts
    return sets


def evaluate_set(engine, processor, make_env, tasks, layouts, limits, cfg: EvalRunConfig, set_index: int,
                 out_dir: Path, bar) -> dict[str, float]:
    """Play `eval.n` episodes of every task, `eval.batch_size` episodes at a time; save them under
    out_dir and return the set's metrics (eval/<set>/...)."""
    from envs.eval_sets import solvable_fraction

    from rlfw.evaluate import episode_metrics, pass_at_k, play, save_episodes
    from rlfw.rollout.types import SamplingParams, sample_seed

    v, name = cfg.eval, out_dir.name
    greedy = v.temperature == 0
    params = SamplingParams(temperature=v.temperature if not greedy else 1.0, top_p=v.top_p,
                            max_new_tokens=limits.max_new_tokens, greedy=greedy)
    per_batch = max(1, v.batch_size // v.n)  # tasks per batch; a task's n episodes share it
    envs = [make_env() for _ in range(min(len(tasks), per_batch) * v.n)]
    episodes, notes = [], []
    for start in range(0, len(tasks), per_batch):
        chunk = tasks[start:start + per_batch]
        # requests are keyed (episode in this batch, turn): a seed per (set, batch) keeps batches' draws apart
        engine.set_seed(sample_seed(cfg.seed, (set_index, start)))
        n_recorded = min(max(v.save_gifs - len(episodes), 0), len(chunk) * v.n)
        played, played_notes = play(engine, processor, envs, chunk, limits, params, v.n, n_recorded,
                                    keep_frames=n_recorded > 0)
        episodes += played
        notes += played_notes
        bar.update(len(played))
        bar.set_postfix_str(f"{name} pass@1 {np.mean([e.success for e in episodes]):.3f}")
    metrics = episode_metrics(episodes, f"eval/{name}")
    if v.n > 1:
        successes = np.array([e.success for e in episodes], dtype=float).reshape(len(tasks), v.n)  # [tasks, n]
        metrics[f"eval/{name}/pass_at_{v.n}"] = pass_at_k(successes, v.n)
    if layouts is not None:
        metrics[f"eval/{name}/solvable_fraction"] = solvable_fraction(layouts, limits.max_turns)
    save_episodes(episodes, out_dir, notes, limits.max_turns)
    return metrics


def result_table(sets: dict, metrics: dict[str, float], n: int) -> str:
    """One Markdown row per set: episodes, pass@1 (and pass@n), solvable fraction, turns, invalid actions."""
    head = ["set", "episodes", "pass@1", *([f"pass@{n}"] if n > 1 else []), "solvable", "mean turns",
            "invalid-action rate"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, (tasks, _) in sets.items():
        m = {k.split("/")[-1]: val for k, val in metrics.items() if k.startswith(f"eval/{name}/")}
        solvable = f"{m['solvable_fraction']:.3f}" if "solvable_fraction" in m else "n/a"
        cells = [name, str(len(tasks) * n), f"{m['pass_at_1']:.3f}", *([f"{m[f'pass_at_{n}']:.3f}"] if n > 1 else []),
                 solvable, f"{m['turns_mean']:.2f}", f"{m['invalid_action_rate']:.3f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def run_eval(cfg: EvalRunConfig) -> dict:
    """Validate, load the policy, play every set, write metrics.json and print the table."""
    from tqdm import tqdm

    from rlfw.build import make_env_fn, prepare_base_model, seed_everything
    from rlfw.config_io import save_run_config
    from rlfw.rollout.agent_loop import LoopLimits

    validate_eval(cfg)
    v, e = cfg.eval, cfg.env
    torch.set_num_threads(v.torch_threads)
    out_dir = Path(v.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_run_config(cfg, out_dir)
    seed_everything(cfg.seed)
    model_path = prepare_base_model(cfg.model, make_env_fn(e), out_dir, cfg.seed)
    sets = evaluation_sets(cfg)
    engine, processor, policy = build_policy_engine(cfg, model_path)
    make_env = make_env_fn(e, processor.crop_px)  # the observations the policy was trained on
    where = f" at {v.base_url}" if v.base_url else ""
    print(f"rlfw.eval: {'a random-init tiny_vl' if cfg.model.path is None else 'model'} {policy['model']}{where}"
          + (f" + adapter {policy['adapter']}" if v.adapter else "") + f", {', '.join(sets)}", flush=True)
    limits = LoopLimits(max_turns=e.max_turns, max_new_tokens=e.max_new_tokens,
                        max_episode_tokens=e.max_episode_tokens, history=e.history)
    metrics: dict[str, float] = {}
    with tqdm(total=sum(len(t) for t, _ in sets.values()) * v.n, desc="eval", unit="episode",
              dynamic_ncols=True) as bar:
        for i, (name, (tasks, layouts)) in enumerate(sets.items()):
            metrics.update(evaluate_set(engine, processor, make_env, tasks, layouts, limits, cfg, i,
                                        out_dir / name, bar))
    record = {
        "command": "python -m rlfw.eval " + " ".join(_overrides()),
        **policy,
        "env": e.name, "max_turns": e.max_turns, "n": v.n, "temperature": v.temperature, "top_p": v.top_p,
        "seed": cfg.seed,
        "sets": {name: {"mazes": len(tasks), "episodes": len(tasks) * v.n} for name, (tasks, _) in sets.items()},
        **metrics,
    }
    (out_dir / "metrics.json").write_text(json.dumps(record, indent=2))
    print(result_table(sets, metrics, v.n), flush=True)
    print(f"rlfw.eval: outputs in {out_dir.resolve()} (metrics.json, <set>/episodes.jsonl and GIFs)", flush=True)
    return record


def _overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


@hydra.main(version_base="1.3", config_path="../conf", config_name="eval")
def main(cfg: DictConfig) -> float:
    record = run_eval(OmegaConf.to_object(cfg))
    first = next(iter(record["sets"]))
    return record[f"eval/{first}/pass_at_1"]  # the sweep objective


if __name__ == "__main__":
    main()
