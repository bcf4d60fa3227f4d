"""Where a maze policy goes wrong: replay a run's saved greedy evaluation episodes against the oracle.

    python scripts/failure_analysis.py runs/<run>                 # first and last evaluation
    python scripts/failure_analysis.py runs/<run> --steps 0 120
    python scripts/failure_analysis.py runs/<run> --steps 120 --policy runs/<run>/lora_sync/v120
    python scripts/failure_analysis.py outputs/<eval>                # an rlfw.eval folder, e.g. 4,096 held-out
    python scripts/failure_analysis.py outputs/<eval> --policy runs/<run>/lora_sync/v120

For each evaluation set it prints pass@1; the error rate of the first wrong move, per kind of square
(corridor: two open neighbours, junction: three or four, dead end: one), counted along each episode
until its first wrong move; how often an episode recovers after a wrong move; and how failures end
(stopped off the target, stuck bumping into a wall, looping over the same squares, out of turns).
A wrong move is any action other than the env's BFS-best one (`best_action()`); in a perfect maze
that route is unique. Works for envs built on envs.gridnav.GridNavEnv.

The env (and, for `--policy`, the base model) is the one the run was started with: its saved
`<run>/config.yaml` (rlfw.config_io), not a config recomposed from today's `conf/`. A `python -m
rlfw.eval` folder holds one evaluation (`<set>/episodes.jsonl` per set, greedy, eval.n=1): its sets
are replayed on the mazes that evaluation played, and `--policy` needs no `--steps` there (its base
is the evaluation's model.path). Larger sets count more squares: 4,096 held-out mazes give about
9,500 junctions where the 512 give about 1,200.

With `--policy` (the policy that played those episodes: a model folder, or a PEFT adapter folder on
top of the run's base, its SFT stage's checkpoint where it had one, else its `model.path`) it also
reports how sure the policy was where it first went wrong: the probability it gave the oracle's move
there. A policy unsure at those squares can still find the
right move by sampling; one that is confidently wrong rarely samples it, so RL's outcome reward
rarely gets to reward it.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from envs.actions import STOP, parse_action
from envs.layout import open_moves, parse_layout
from rlfw.build import eval_tasks, make_env_fn
from rlfw.config import EvalRunConfig, rl_start_model
from rlfw.config_io import RUN_CONFIG_FILE, load_run_config

KINDS = ("corridor", "junction", "dead_end", "on_target")


def square_kind(walls, agent) -> str:
    """corridor (two open neighbours), junction (three or four) or dead_end (one)."""
    open_ = len(open_moves(walls, tuple(agent)))
    return "junction" if open_ >= 3 else "dead_end" if open_ == 1 else "corridor"


def load_policy_for_scoring(path: Path, base: str | None):
    """A model folder, or a PEFT adapter folder applied to `base` (the run's base model). A folder
    without processor files of its own (`lora_sync/vN`) uses the processor of `base`."""
    from transformers import AutoModelForImageTextToText

    from rlfw.models.processing import PolicyProcessor
    from rlfw.validation import model_folder_errors

    adapter = (path / "adapter_config.json").exists()
    processor_from = path if (path / "preprocessor_config.json").exists() else base
    if base is None and (adapter or processor_from is None):
        raise SystemExit(f"{path} needs the run's base model, and the run's model.path is not set: "
                         "give it with --base")
    if (adapter or processor_from == base) and (errs := model_folder_errors(base, "the run's base model")):
        raise SystemExit(f"{path} needs the run's base model, and {errs[0]} (moved or deleted?): "
                         "give its folder with --base")
    processor = PolicyProcessor.from_pretrained(processor_from)
    model = AutoModelForImageTextToText.from_pretrained(str(base if adapter else path), dtype=torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(path))
    return model, processor


def move_prob(model, processor, obs: dict, task: str, feedback: str, action: str) -> float:
    """The policy's probability of replying `action` (its text, then end of turn) to the turn the
    rollout shows it with history none: the current image, the task text, the last feedback."""
    from rlfw.policy import sequence_logprobs
    from rlfw.rollout.demos import to_segment

    from envs.wrappers import crop_image

    # `env` here is the bare env (its layout and oracle): cut the border the policy's envs cut
    segment = to_segment(processor, crop_image(obs["image"], processor.crop_px), task, feedback, action)
    with torch.no_grad():
        logp, mask, _ = sequence_logprobs(model, processor, [segment])
    return float((logp * mask).sum().exp())


def analyse(env, tasks, episodes: list[dict], policy=None) -> dict:
    """Replay `episodes` against the oracle; with `policy` (model, processor) also score, at each
    episode's first wrong move, the probability the policy gave the oracle's move."""
    at_risk, first_wrong, ends = Counter(), Counter(), Counter()
    oracle_prob: dict[str, list[float]] = {}
    with_error = recovered = 0
    for ep in episodes:
        task = tasks[ep["index"]]
        obs, info = env.reset(seed=task.seed, options={"layout": task.layout} if task.layout else None)
        walls = parse_layout(env.layout())[0]
        task_text, feedback = obs["text"], ""
        visits, bumps, wrong = Counter(), 0, False
        for text in ep["actions"]:  # the policy's generated text, as the env received it
            best = env.action_strings.index(env.best_action())
            if not wrong:
                kind = "on_target" if best == STOP else square_kind(walls, info["agent"])
                at_risk[kind] += 1
                if parse_action(text, env.action_format) != best:
                    wrong = True
                    first_wrong[kind] += 1
                    if policy is not None:
                        p = move_prob(*policy, obs, task_text, feedback, env.action_strings[best])
                        oracle_prob.setdefault(kind, []).append(p)
            visits[info["agent"]] += 1
            obs, _, _, _, info = env.step(text)
            feedback = obs["text"]
            bumps = bumps + 1 if info["wall_bump"] else 0
        with_error += wrong
        recovered += wrong and ep["success"]
        if not ep["success"]:
            stopped = bool(ep["actions"]) and parse_action(ep["actions"][-1], env.action_format) == STOP
            ends["stopped off target" if stopped else "stuck bumping a wall" if bumps >= 3
                 else "looping" if max(visits.values()) >= 3 else "out of turns"] += 1
    return {"episodes": len(episodes), "solved": sum(ep["success"] for ep in episodes),
            "error_rate": {k: (first_wrong[k], at_risk[k]) for k in KINDS if at_risk[k]},
            "with_error": with_error, "recovered": recovered, "failures": dict(ends), "oracle_prob": oracle_prob}


def report(label: str, r: dict) -> str:
    lines = [f"{label}: pass@1 {r['solved']}/{r['episodes']} = {r['solved'] / r['episodes']:.3f}"]
    rates = ", ".join(f"{k} {w / n:.3f} ({w}/{n})" for k, (w, n) in r["error_rate"].items())
    lines.append(f"  first wrong move, per square until then: {rates}")
    lines.append(f"  episodes with a wrong move: {r['with_error']}, of which solved anyway: {r['recovered']}")
    lines.append(f"  failures end: {r['failures']}")
    if r["oracle_prob"]:
        parts = []
        for kind in (k for k in KINDS if k in r["oracle_prob"]):
            probs = sorted(r["oracle_prob"][kind])
            low = sum(p < 0.05 for p in probs) / len(probs)
            parts.append(f"{kind} median {probs[len(probs) // 2]:.2f} (below 0.05: {low:.0%}, n={len(probs)})")
        lines.append("  the policy's probability of the oracle move at its first wrong move: " + ", ".join(parts))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path,
                    help=f"an rlfw.run or rlfw.sft run folder ({RUN_CONFIG_FILE} and eval/step_N/<set>/), "
                    f"or an rlfw.eval folder ({RUN_CONFIG_FILE} and <set>/)")
    ap.add_argument("--steps", type=int, nargs="*", help="evaluation steps (default: the first and the last)")
    ap.add_argument("--policy", type=Path, help="the policy that played the chosen steps' episodes (a model "
                    "folder, or an adapter folder such as <run>/lora_sync/vN): also report how sure it was "
                    "where it went wrong")
    ap.add_argument("--base", help="with --policy: the base model folder, where the run's has moved since "
                    "(default: its SFT stage's checkpoint where it had one, else its model.path)")
    args = ap.parse_args()
    if not (args.run / RUN_CONFIG_FILE).exists():
        raise SystemExit(f"{args.run / RUN_CONFIG_FILE} is missing: the run predates saved run configs "
                         f"(or {args.run} is not an rlfw.run, rlfw.sft or rlfw.eval folder)")
    cfg = load_run_config(args.run)  # the config the run was started with, not today's conf/
    one_evaluation = isinstance(cfg, EvalRunConfig)
    if one_evaluation and args.steps:
        ap.error(f"{args.run} is an rlfw.eval folder: it holds one evaluation, with no --steps")
    if one_evaluation and cfg.eval.n != 1:
        raise SystemExit(f"{args.run} holds eval.n={cfg.eval.n} samples per maze; the analysis replays "
                         "one greedy episode per maze (eval.n=1)")
    if args.policy and not one_evaluation and (not args.steps or len(args.steps) != 1):
        ap.error("--policy scores one evaluation's episodes: give the step it played with --steps N")
    env_cfg = cfg.env
    policy = None
    if args.policy:
        policy = load_policy_for_scoring(args.policy, args.base or rl_start_model(cfg))
        policy[0].eval()
    env = make_env_fn(env_cfg)().unwrapped
    for label, episodes, tasks in evaluations(args.run, cfg, args.steps):
        print(report(label, analyse(env, tasks, episodes, policy)), flush=True)


def read_episodes(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def evaluations(run: Path, cfg, steps: list[int] | None):
    """(label, episodes, tasks) for each saved evaluation set to replay: a run's `eval/step_N/<set>/`
    at the chosen steps (default: the first and the last), or an rlfw.eval folder's `<set>/`, its sets
    rebuilt from its saved config (rlfw.eval.evaluation_sets: the mazes it played, layouts files too)."""
    if isinstance(cfg, EvalRunConfig):
        from rlfw.eval import evaluation_sets

        sets = {name: tasks for name, (tasks, _) in evaluation_sets(cfg).items()}
        saved = [name for name in sets if (run / name / "episodes.jsonl").exists()]
        if not saved:
            raise SystemExit(f"no episodes under {run}: expected "
                             + ", ".join(f"{name}/episodes.jsonl" for name in sets))
        for name in saved:
            yield f"eval {name}", read_episodes(run / name / "episodes.jsonl"), sets[name]
        return
    saved = sorted(int(p.name.split("_")[1]) for p in (run / "eval").glob("step_*"))
    if not saved:
        raise SystemExit(f"no evaluation episodes under {run / 'eval'} (trainer.eval_save_episodes)")
    for step in steps or sorted({saved[0], saved[-1]}):
        for path in sorted((run / "eval" / f"step_{step:06d}").glob("*/episodes.jsonl")):
            episodes, name = read_episodes(path), path.parent.name
            tasks, _ = eval_tasks(cfg.env, "heldout", len(episodes)) if name == "heldout" else eval_tasks(cfg.env)
            yield f"step {step} {name}", episodes, tasks


if __name__ == "__main__":
    main()
