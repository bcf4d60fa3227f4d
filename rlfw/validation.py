"""Cross-field checks of a composed config, run before anything starts (`validate`, `validate_sft`,
`validate_eval`).

A schema in `rlfw.config` catches a misspelt key or a wrongly typed value while Hydra composes;
what a schema cannot express (a mini-batch that must divide the batch, a name that must be
registered, settings that only make sense together) is checked here. Every problem found is
listed at once, each with how to fix it.
"""

from __future__ import annotations

import importlib.util
import math

from rlfw.config import Config, EnvConfig, EvalRunConfig, MazeEnvConfig, SFTRunConfig, sft_stage_config
from rlfw.rollout.backends import BACKENDS


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it."""


def _choice(value: str, valid: list[str], key: str) -> list[str]:
    return [] if value in valid else [f"{key}={value!r} is not one of {valid}"]


def _autocast_errors(model, keys: tuple[str, ...] = ("train_autocast", "engine_autocast")) -> list[str]:
    """model.train_autocast and model.engine_autocast where a policy is trained (RL and SFT); the
    evaluator checks engine_autocast alone. model.attn_implementation is checked by transformers when
    the policy loads, with the kernels this install has."""
    errs = []
    for key in keys:
        value = getattr(model, key)
        errs += _choice(value, [None, "auto", "bfloat16"], f"model.{key}")
        if value and model.dtype != "float32":
            errs.append(f"model.{key}={value} autocasts a float32 model; "
                        f"model.dtype={model.dtype} is already low precision: set one of them")
    return errs


def _fixed_set_size_errors(env: EnvConfig, eval_set: str | None = None, key: str = "env.eval_set") -> list[str]:
    """VisGym's fixed sets are 9x9 (eval64) and 11x11 (eval64_hard) mazes: the env must match."""
    eval_set = eval_set or env.eval_set
    if not isinstance(env, MazeEnvConfig) or eval_set not in ("eval64", "eval64_hard"):
        return []
    want = "easy" if eval_set == "eval64" else "hard"
    if env.difficulty != want or "size" in env.kwargs:
        return [f"{key}={eval_set} holds {want} mazes; set env.difficulty={want} or {key}=heldout"]
    return []


def _vllm_errors(cfg: Config, environment: bool) -> list[str]:
    from rlfw.rollout.vllm_engine import VLLM_LORA_RANKS, vllm_lora_rank  # vllm itself is not imported

    v, rank, errs = cfg.cluster.vllm, cfg.model.lora.rank, []
    if environment and importlib.util.find_spec("vllm") is None:
        errs.append("cluster.engine_backend=vllm needs vLLM in this Python environment: on a GPU machine "
                    "pip install -e '.[vllm]'; on a CPU machine bash scripts/setup.sh --vllm, then run with "
                    ".venv-vllm/bin/python")
    if not 0 < v.memory_utilization < 1:
        errs.append(f"cluster.vllm.memory_utilization={v.memory_utilization} must be in (0, 1)")
    if v.max_lora_rank is not None and v.max_lora_rank not in VLLM_LORA_RANKS:
        errs.append(f"cluster.vllm.max_lora_rank={v.max_lora_rank} is not a rank vLLM accepts: {list(VLLM_LORA_RANKS)}")
    if rank and vllm_lora_rank(v.max_lora_rank, rank) < rank:
        errs.append(f"model.lora.rank={rank} exceeds what vLLM accepts (cluster.vllm.max_lora_rank="
                    f"{v.max_lora_rank}, at most {VLLM_LORA_RANKS[-1]}); raise cluster.vllm.max_lora_rank or lower the rank")
    if v.tensor_parallel_size < 1 or v.max_num_seqs < 1:
        errs.append(f"cluster.vllm.tensor_parallel_size={v.tensor_parallel_size} and cluster.vllm.max_num_seqs="
                    f"{v.max_num_seqs} must be >= 1")
    if v.tensor_parallel_size > 1 and cfg.cluster.gpus_per_worker < v.tensor_parallel_size:
        errs.append(f"cluster.vllm.tensor_parallel_size={v.tensor_parallel_size} needs cluster.gpus_per_worker >= "
                    f"{v.tensor_parallel_size} (tensor parallelism shards an engine over GPUs)")
    errs += _choice(v.sleep_level, [0, 1], "cluster.vllm.sleep_level")
    return errs


def _oracle_errors(cfg: Config) -> list[str]:
    """The oracle term (algo.oracle_coef) and restarts (algo.restart_fraction) need one turn per
    training sequence and an env with an oracle (and, for restarts, replayable layouts)."""
    from rlfw.rollout.oracle import ORACLE_STATES

    a, e = cfg.algo, cfg.env
    errs = _choice(a.oracle_states, sorted(ORACLE_STATES), "algo.oracle_states")
    if a.oracle_coef < 0:
        errs.append(f"algo.oracle_coef={a.oracle_coef} must be >= 0 (0 turns the oracle term off)")
    if a.oracle_fresh_states < 0 or (a.oracle_fresh_states > 0 and a.oracle_coef == 0):
        errs.append(f"algo.oracle_fresh_states={a.oracle_fresh_states} must be >= 0, and > 0 only with "
                    f"algo.oracle_coef > 0 (it adds states to the oracle term; got oracle_coef={a.oracle_coef})")
    if not 0 <= a.oracle_fresh_junction_fraction <= 1:
        errs.append(f"algo.oracle_fresh_junction_fraction={a.oracle_fresh_junction_fraction} must be in [0, 1]")
    elif a.oracle_fresh_junction_fraction > 0 and a.oracle_fresh_states == 0:
        errs.append("algo.oracle_fresh_junction_fraction applies to algo.oracle_fresh_states > 0 only; set "
                    "algo.oracle_fresh_states (how many fresh states a step labels) or the fraction to 0")
    if not 0 <= a.oracle_fresh_from < 1:
        errs.append(f"algo.oracle_fresh_from={a.oracle_fresh_from} must be in [0, 1) (the fraction of the run "
                    "done before fresh states join; 0 = from the first step)")
    elif a.oracle_fresh_from > 0 and a.oracle_fresh_states == 0:
        errs.append("algo.oracle_fresh_from applies to algo.oracle_fresh_states > 0 only; set "
                    "algo.oracle_fresh_states (how many fresh states a step labels) or oracle_fresh_from to 0")
    tag_weights = dict(a.oracle_tag_weights or {})
    for tag, w in tag_weights.items():
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            errs.append(f"algo.oracle_tag_weights.{tag}={w} must be a finite number >= 0 (1 leaves the tag as is)")
    if tag_weights and a.oracle_coef == 0:
        unset = " ".join(f"'~algo.oracle_tag_weights.{tag}'" for tag in tag_weights)
        errs.append(f"algo.oracle_tag_weights={tag_weights} weighs the oracle term's labels; it needs "
                    f"algo.oracle_coef > 0, or remove them: {unset}")
    tag_states = list(a.oracle_tag_states or [])
    if tag_states and a.oracle_coef == 0:
        errs.append(f"algo.oracle_tag_states={tag_states} adds labels to the oracle term; it needs "
                    "algo.oracle_coef > 0, or set algo.oracle_tag_states=[]")
    if not 0 <= a.restart_fraction <= 1:
        errs.append(f"algo.restart_fraction={a.restart_fraction} must be in [0, 1] (0 turns restarts off)")
    if a.restart_buffer_size < 1:
        errs.append(f"algo.restart_buffer_size={a.restart_buffer_size} must be >= 1")
    wanted = []  # (setting, env methods it needs)
    if a.oracle_coef > 0:
        wanted.append((f"algo.oracle_coef={a.oracle_coef}", ["best_action"]))
    if a.oracle_fresh_states > 0:
        wanted.append((f"algo.oracle_fresh_states={a.oracle_fresh_states}", ["best_action", "layout"]))
    if a.restart_fraction > 0:
        wanted.append((f"algo.restart_fraction={a.restart_fraction}", ["best_action", "layout"]))
    if tag_weights and a.oracle_coef > 0:
        wanted.append((f"algo.oracle_tag_weights={tag_weights}", ["best_action", "state_tag"]))
    if tag_states and a.oracle_coef > 0:
        wanted.append((f"algo.oracle_tag_states={tag_states}", ["best_action", "state_tag"]))
    if wanted and e.history == "full":
        errs.append(f"{' and '.join(k for k, _ in wanted)} need env.history=none: with env.history=full an episode "
                    "is one training sequence (the oracle term needs each turn's own prompt) and a restart could not "
                    "restore the conversation before its square; set env.history=none, or turn them off (=0)")
    if wanted:
        from rlfw.build import make_env_fn

        try:
            probe = make_env_fn(e)().unwrapped
        except Exception as exc:  # noqa: BLE001  (any env construction error, reported with the others)
            return errs + [f"env {e.id} could not be made: {exc}"]
        for key, methods in wanted:
            missing = [m for m in methods if not hasattr(probe, m)]
            if missing:
                errs.append(f"{key} needs an env with an oracle, but {e.id} has no {' or '.join(f'{m}()' for m in missing)}; "
                            "use a grid env (rlfw/Maze2D-v0, rlfw/GridGoal-v0) or set it to 0")
        known = getattr(probe, "state_tags", ())
        for key, named in (("algo.oracle_tag_weights", tag_weights), ("algo.oracle_tag_states", tag_states)):
            unknown = sorted(set(named) - set(known)) if hasattr(probe, "state_tag") and a.oracle_coef > 0 else []
            if unknown:
                errs.append(f"{key} names {unknown}, which {e.id} never returns from state_tag(); "
                            f"its tags: {list(known)}")
    return errs


def validate(cfg: Config, environment: bool = True) -> None:
    """Check cross-field invariants up front; raise ConfigError listing every problem found.
    `environment=False` leaves out what depends on this machine (is vLLM installed), to check a
    cluster preset anywhere."""
    from rlfw.algos import KL_KINDS, LOSS_AGG_MODES, import_algo_module, list_adv_ests, list_policy_losses

    a, e, c = cfg.algo, cfg.env, cfg.cluster
    if cfg.sft_stage is not None:  # the stage runs first, so its settings are checked first
        try:
            validate_sft(sft_stage_config(cfg))
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("  - sft.", "  - sft_stage.")) from None
    errs: list[str] = []
    try:
        import_algo_module(a.module)  # the user's registered variants count as valid names
    except ImportError as exc:
        errs.append(str(exc))
    errs += _choice(a.advantage_estimator, list_adv_ests(), "algo.advantage_estimator")
    errs += _choice(a.policy_loss_type, list_policy_losses(), "algo.policy_loss_type")
    errs += _choice(a.loss_reduction, list(LOSS_AGG_MODES), "algo.loss_reduction")
    errs += _choice(a.kl_estimator_type, list(KL_KINDS), "algo.kl_estimator_type")
    errs += _choice(a.dynamic_sampling, ["off", "drop", "resample"], "algo.dynamic_sampling")
    errs += _choice(a.old_logprobs, ["trainer", "rollout"], "algo.old_logprobs")
    if a.target_kl is not None and a.target_kl <= 0:
        errs.append(f"algo.target_kl={a.target_kl} must be > 0 (or null to never stop early)")
    if a.step_advantage_weight < 0:
        errs.append(f"algo.step_advantage_weight={a.step_advantage_weight} must be >= 0 (0 turns it off)")
    if a.step_advantage_weight > 0 and e.history == "full":
        errs.append("algo.step_advantage_weight > 0 (GiGPO's per-turn credit) needs env.history=none: with "
                    "env.history=full an episode is one training sequence, so a per-turn advantage cannot be "
                    "applied to its turns; set env.history=none or algo.step_advantage_weight=0")
    if not 0 < a.step_gamma <= 1:
        errs.append(f"algo.step_gamma={a.step_gamma} must be in (0, 1]")
    errs += _oracle_errors(cfg)
    errs += _choice(a.lr_schedule, ["constant", "cosine"], "algo.lr_schedule")
    errs += _choice(e.history, ["none", "full"], "env.history")
    errs += _choice(c.engine_backend, sorted(BACKENDS), "cluster.engine_backend")
    errs += _choice(cfg.model.dtype, ["float32", "bfloat16"], "model.dtype")
    errs += _autocast_errors(cfg.model)
    if cfg.model.compile and c.trainer_ranks > 1:
        errs.append("model.compile=true is not supported with cluster.trainer_ranks > 1 (FSDP2) yet; "
                    "set model.compile=false")
    if a.n_samples_per_prompt < 2:
        errs.append(
            f"algo.n_samples_per_prompt={a.n_samples_per_prompt}: group-relative advantages need at least 2 "
            "samples per prompt; set algo.n_samples_per_prompt>=2"
        )
    if a.tasks_per_step < 1 or a.tasks_per_optimizer_step < 1 or a.tasks_per_step % a.tasks_per_optimizer_step:
        errs.append(
            f"algo.tasks_per_optimizer_step={a.tasks_per_optimizer_step} must be >= 1 and divide algo.tasks_per_step="
            f"{a.tasks_per_step}; e.g. set algo.tasks_per_optimizer_step={a.tasks_per_step}"
        )
    for key, val in [("algo.sequences_per_forward", a.sequences_per_forward), ("algo.update_epochs", a.update_epochs),
                     ("algo.max_sample_rounds", a.max_sample_rounds),
                     ("env.max_turns", e.max_turns), ("env.max_new_tokens", e.max_new_tokens),
                     ("cluster.num_engines", c.num_engines), ("cluster.trainer_ranks", c.trainer_ranks),
                     ("cluster.torch_threads", c.torch_threads),
                     ("trainer.total_steps", cfg.trainer.total_steps)]:
        if val < 1:
            errs.append(f"{key}={val} must be >= 1")
    for key, val in [("cluster.max_engine_restarts", c.max_engine_restarts),
                     ("cluster.max_trainer_restarts", c.max_trainer_restarts)]:
        if val < 0:
            errs.append(f"{key}={val} must be >= 0")
    if cfg.trainer.max_minutes is not None and cfg.trainer.max_minutes <= 0:
        errs.append(f"trainer.max_minutes={cfg.trainer.max_minutes} must be > 0 (or null for no time limit)")
    errs += _choice(cfg.trainer.schedule, ["steps", "minutes"], "trainer.schedule")
    if cfg.trainer.schedule == "minutes" and cfg.trainer.max_minutes is None:
        errs.append("trainer.schedule=minutes spans trainer.max_minutes; set it (e.g. trainer.max_minutes=20)")
    if a.lr <= 0:
        errs.append(f"algo.lr={a.lr} must be > 0")
    if a.warmup_steps < 0 or not 0 <= a.min_lr_ratio <= 1:
        errs.append(f"need algo.warmup_steps >= 0 and 0 <= algo.min_lr_ratio <= 1 (got {a.warmup_steps}, {a.min_lr_ratio})")
    if not a.pg_coef >= 0:  # NaN too
        errs.append(f"algo.pg_coef={a.pg_coef} must be >= 0 (1 = the algorithm as published, 0 = no policy-gradient term)")
    elif a.pg_coef == 0:
        if a.oracle_coef == 0:  # KL to a policy's own start and entropy alone train nothing useful
            errs.append("algo.pg_coef=0 leaves nothing to train without the oracle term; "
                        "set algo.oracle_coef > 0 (DAgger alone) or algo.pg_coef > 0")
        for key, val, off in [("algo.dynamic_sampling", a.dynamic_sampling, "off"),
                              ("algo.step_advantage_weight", a.step_advantage_weight, 0.0)]:
            if val != off:
                errs.append(f"{key}={val} acts through the advantages, which algo.pg_coef=0 leaves unused; "
                            f"set it to {off}")
    if a.policy_loss_type == "gspo" and a.loss_reduction != "seq-mean-token-mean":
        errs.append("algo.policy_loss_type=gspo is GSPO only with algo.loss_reduction=seq-mean-token-mean")
    if a.loss_max_tokens is not None and (a.loss_reduction != "seq-mean-token-sum" or a.loss_max_tokens < 1):
        errs.append("algo.loss_max_tokens applies to algo.loss_reduction=seq-mean-token-sum only and must be >= 1")
    if cfg.model.lora.dropout and cfg.model.lora.rank:
        errs.append(f"model.lora.dropout={cfg.model.lora.dropout}: dropout makes the policy stochastic, so the "
                    "PPO ratio of a sample to itself is not 1; set model.lora.dropout=0 for RL")
    if not (0 <= a.eps_clip_low < 1) or a.eps_clip_high < 0:
        errs.append(f"clip ranges must satisfy 0 <= algo.eps_clip_low < 1 and algo.eps_clip_high >= 0 "
                    f"(got {a.eps_clip_low}, {a.eps_clip_high})")
    if a.temperature <= 0:
        errs.append(f"algo.temperature={a.temperature} must be > 0 (evaluation is greedy on its own)")
    if not 0 < a.top_p <= 1:
        errs.append(f"algo.top_p={a.top_p} must be in (0, 1]")
    if cfg.model.lora.rank < 0:
        errs.append(f"model.lora.rank={cfg.model.lora.rank} must be >= 0 (0 = full fine-tuning)")
    t = cfg.trainer
    for key, val in [("trainer.eval_interval", t.eval_interval), ("trainer.ckpt_interval", t.ckpt_interval),
                     ("trainer.hf_save_interval", t.hf_save_interval), ("trainer.max_ckpts_to_keep", t.max_ckpts_to_keep),
                     ("trainer.max_exports_to_keep", t.max_exports_to_keep)]:
        if val < 0:
            errs.append(f"{key}={val} must be >= 0 (0 disables)")
    errs += _choice(t.resume_mode, ["none", "latest", "from_path"], "trainer.resume_mode")
    if t.resume_mode == "from_path" and not t.resume_path:
        errs.append("trainer.resume_mode=from_path needs trainer.resume_path=<ckpt_path>/global_step_N")
    if c.engine_backend == "vllm":
        errs += _vllm_errors(cfg, environment)
    if t.heldout_eval_size and (not t.eval_interval or e.eval_set == "heldout"):
        errs.append("trainer.heldout_eval_size needs trainer.eval_interval > 0 and an env.eval_set other than heldout")
    if t.eval_interval and not cfg.logger.jsonl:
        errs.append("evaluation reports read metrics.jsonl: keep logger.jsonl=true or set trainer.eval_interval=0")
    errs += _fixed_set_size_errors(e)
    if errs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errs))


def validate_sft(cfg: SFTRunConfig) -> None:
    s = cfg.sft
    errs = _choice(s.states, ["all_squares", "oracle_path"], "sft.states")
    errs += _choice(cfg.model.dtype, ["float32", "bfloat16"], "model.dtype")
    errs += _autocast_errors(cfg.model)
    for key, val in [("sft.steps", s.steps), ("sft.batch_size", s.batch_size), ("sft.eval_size", s.eval_size),
                     ("sft.torch_threads", s.torch_threads)]:
        if val < 1:
            errs.append(f"{key}={val} must be >= 1")
    if not 0 <= s.noise < 1:
        errs.append(f"sft.noise={s.noise} must be in [0, 1)")
    if s.noise and s.states != "oracle_path":
        errs.append("sft.noise applies to sft.states=oracle_path only; set sft.states=oracle_path or sft.noise=0")
    if not 0 <= s.junction_fraction <= 1:
        errs.append(f"sft.junction_fraction={s.junction_fraction} must be in [0, 1]")
    if s.junction_fraction and s.states != "all_squares":
        errs.append("sft.junction_fraction applies to sft.states=all_squares only; set sft.junction_fraction=0")
    if s.warmup_steps < 0:
        errs.append(f"sft.warmup_steps={s.warmup_steps} must be >= 0")
    if s.max_grad_norm <= 0:
        errs.append(f"sft.max_grad_norm={s.max_grad_norm} must be > 0")
    errs += _fixed_set_size_errors(cfg.env)
    if not 0 <= s.decay_fraction <= 1:
        errs.append(f"sft.decay_fraction={s.decay_fraction} must be in [0, 1]")
    if s.stop_at_pass_at_1 is not None and not 0 < s.stop_at_pass_at_1 <= 1:
        errs.append(f"sft.stop_at_pass_at_1={s.stop_at_pass_at_1} must be in (0, 1]")
    if s.max_minutes is not None and s.max_minutes <= 0:
        errs.append(f"sft.max_minutes={s.max_minutes} must be > 0 (or null for no time limit)")
    errs += _choice(s.schedule, ["steps", "minutes"], "sft.schedule")
    errs += _choice(s.resume_mode, ["none", "latest"], "sft.resume_mode")
    if s.ckpt_interval < 0:
        errs.append(f"sft.ckpt_interval={s.ckpt_interval} must be >= 0 (0: no resumable state)")
    if s.schedule == "minutes" and s.max_minutes is None:
        errs.append("sft.schedule=minutes spans sft.max_minutes; set it (e.g. sft.max_minutes=30)")
    if errs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errs))


def model_folder_errors(path: str | None, key: str) -> list[str]:
    """A local model folder must exist and hold config.json; 'org/name' (no such local path) is a hub id."""
    from pathlib import Path

    if path is None:
        return []
    folder = Path(path).expanduser()
    hub_id = not folder.is_absolute() and not path.startswith((".", "~")) and path.count("/") == 1
    if folder.is_dir():
        return [] if (folder / "config.json").exists() else [
            f"{key}={path} is not a model folder (no config.json); for a LoRA adapter folder use eval.adapter="]
    return [] if hub_id and not folder.exists() else [f"{key}={path}: no such model folder"]


def _adapter_errors(path: str | None) -> list[str]:
    from pathlib import Path

    if path is None:
        return []
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return [f"eval.adapter={path}: no such folder"]
    if not (folder / "adapter_config.json").exists():
        full = (folder / "config.json").exists()
        return [f"eval.adapter={path} holds no adapter_config.json, so it is not a PEFT adapter folder"
                + ("; it is a full model folder: pass it as model.path= instead" if full else "")]
    if not any((folder / name).exists() for name in ("adapter_model.safetensors", "adapter_model.bin")):
        return [f"eval.adapter={path} holds adapter_config.json but no adapter_model.safetensors"]
    return []


def _layout_shape_errors(env: EnvConfig, layouts: list[dict], what: str) -> list[str]:
    """Records must match the env's grid (a maze env replays only layouts of its own size)."""
    from rlfw.build import make_env_fn

    try:
        shape = getattr(make_env_fn(env)().unwrapped, "shape", None)
    except Exception as exc:  # noqa: BLE001  (any env construction error, reported with the others)
        return [f"env {env.id} could not be made: {exc}"]
    if shape is None:
        return [f"{what}: env {env.id} cannot replay layouts; use eval.sets=[heldout]"]
    bad = [i for i, r in enumerate(layouts) if (len(r["grid"]), len(r["grid"][0])) != tuple(shape)]
    if bad:
        r = layouts[bad[0]]
        return [f"{what}: {len(bad)} record(s) (first: {bad[0]}) are {len(r['grid'])}x{len(r['grid'][0])} but "
                f"env {env.name} is {shape[0]}x{shape[1]}; choose a matching env (env.difficulty=hard is 11x11)"]
    return []


def validate_eval(cfg: EvalRunConfig) -> None:
    """Check an evaluation before any model is loaded: the policy's folders, the sets and the
    layouts file (read and checked here), and the sampling settings."""
    from pathlib import Path

    from envs.eval_sets import FIXED_SETS, load_eval_set, load_layout_file

    from rlfw.build import eval_set_names

    v = cfg.eval
    valid_sets = ["heldout", *sorted(FIXED_SETS)]
    errs = _choice(cfg.model.dtype, ["float32", "bfloat16"], "model.dtype")
    errs += _autocast_errors(cfg.model, ("engine_autocast",))
    errs += _choice(v.device, ["cpu", "cuda"], "eval.device")
    if v.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            errs.append("eval.device=cuda, but torch sees no CUDA device; set eval.device=cpu")
    if v.base_url is not None:
        if not v.base_url.startswith(("http://", "https://")):
            errs.append(f"eval.base_url={v.base_url!r}: an http(s) URL of an OpenAI-compatible API, e.g. "
                        "http://127.0.0.1:8000/v1")
        if not v.model:
            errs.append("eval.base_url is set but eval.model is not: name the served model, e.g. "
                        "eval.model=<base id> or eval.model=<base id>:<adapter name> (GET <base_url>/models lists them)")
        if v.adapter:
            errs.append("eval.adapter with eval.base_url: an endpoint serves its own adapters; request one by name "
                        "with eval.model=<base id>:<adapter name>")
        if v.concurrency < 1:
            errs.append(f"eval.concurrency={v.concurrency}: must be >= 1")
    elif v.model is not None:
        errs.append(f"eval.model={v.model!r} names a served model, but eval.base_url is not set")
    errs += model_folder_errors(cfg.model.path, "model.path")
    errs += _adapter_errors(v.adapter)
    sets = eval_set_names(v)
    for name in sets:
        if name not in valid_sets:
            errs.append(f"eval.sets: {name!r} is not one of {valid_sets} (a layouts file goes in eval.layouts=)")
        elif name in FIXED_SETS:
            errs += (_fixed_set_size_errors(cfg.env, name, "eval.sets")
                     or _layout_shape_errors(cfg.env, load_eval_set(name), f"eval.sets: {name}"))
    if len(set(sets)) != len(sets):
        errs.append(f"eval.sets={sets} names a set twice")
    if not sets and not v.layouts:
        errs.append("nothing to evaluate: set eval.sets=[eval64] (or heldout, eval64_hard) or eval.layouts=<file>")
    if v.layouts:
        try:
            errs += _layout_shape_errors(cfg.env, load_layout_file(v.layouts), f"eval.layouts={v.layouts}")
        except ValueError as exc:
            errs.append(f"eval.layouts: {exc}")
        if Path(v.layouts).stem in sets:
            errs.append(f"eval.layouts={v.layouts} would be named {Path(v.layouts).stem!r}, like a set of eval.sets; "
                        "rename the file")
    for key, val in [("eval.n", v.n), ("eval.batch_size", v.batch_size), ("eval.torch_threads", v.torch_threads),
                     ("eval.heldout_size", v.heldout_size), ("env.max_turns", cfg.env.max_turns),
                     ("env.max_new_tokens", cfg.env.max_new_tokens)]:
        if val < 1:
            errs.append(f"{key}={val} must be >= 1")
    if v.save_gifs < 0:
        errs.append(f"eval.save_gifs={v.save_gifs} must be >= 0 (0 saves none)")
    if v.temperature < 0:
        errs.append(f"eval.temperature={v.temperature} must be >= 0 (0 is greedy)")
    if v.n > 1 and v.temperature == 0:
        errs.append(f"eval.n={v.n} greedy episodes of a maze are all the same; set eval.temperature>0 "
                    "(e.g. 1.0) to sample them, or eval.n=1")
    if not 0 < v.top_p <= 1:
        errs.append(f"eval.top_p={v.top_p} must be in (0, 1]")
    if v.top_p < 1 and v.temperature == 0:
        errs.append("eval.top_p applies to sampling only; set eval.temperature>0 or eval.top_p=1")
    errs += _choice(cfg.env.history, ["none", "full"], "env.history")
    if errs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errs))


def validate_serve(cfg) -> None:
    """Check a `python -m rlfw.serve` config before Ray starts: the base folder, the adapters (names,
    ranks, files) in a local adapters folder, the address and the limits."""
    from pathlib import Path

    from rlfw.serve.adapters import REMOTE_SCHEMES, check_adapter_name, is_remote, local_adapters

    s = cfg.serve
    errs = _choice(s.accelerator, ["auto", "cpu", "gpu"], "serve.accelerator")
    errs += _choice(cfg.model.dtype, ["float32", "bfloat16"], "model.dtype")
    if not cfg.model.path:
        errs.append("model.path is not set: serve a model folder (e.g. checkpoints/tiny_vl_maze_sft or an rlfw.sft "
                    "checkpoint); a random-init model is not worth serving")
    elif not s.print_config:
        errs += model_folder_errors(cfg.model.path, "model.path")
    if s.model_id is not None and (":" in s.model_id or not s.model_id.strip()):
        errs.append(f"serve.model_id={s.model_id!r}: must be non-empty and hold no ':' (it separates adapter names)")
    if s.adapters_path:
        if is_remote(s.adapters_path):
            pass
        elif "://" in s.adapters_path:
            errs.append(f"serve.adapters_path={s.adapters_path!r}: a local folder or one of {', '.join(REMOTE_SCHEMES)}")
        elif s.print_config:
            errs.append(f"serve.adapters_path={s.adapters_path!r}: a cluster reads adapters from remote storage; give "
                        f"an {'/'.join(REMOTE_SCHEMES)} URL for serve.print_config")
        elif s.ray_address:
            errs.append(f"serve.adapters_path={s.adapters_path} is a local folder, which rlfw serves from 127.0.0.1 "
                        f"on this machine; the replicas of a cluster (serve.ray_address={s.ray_address}) cannot reach "
                        "it: give an s3:// (or gs://, abfss://, azure://) URL")
        elif not Path(s.adapters_path).is_dir():
            errs.append(f"serve.adapters_path={s.adapters_path}: no such folder")
        else:
            found = local_adapters(s.adapters_path)
            if not found:
                errs.append(f"serve.adapters_path={s.adapters_path} holds no <name>/adapter_config.json; add adapters "
                            f"with python -m rlfw.serve.export <adapter folder> {s.adapters_path} --name <name>")
            for name, info in found.items():
                try:
                    check_adapter_name(name)
                except ValueError as exc:
                    errs.append(f"serve.adapters_path: {exc}")
                if s.max_lora_rank and int(info.get("r", 0)) > s.max_lora_rank:
                    errs.append(f"serve.adapters_path: adapter {name!r} has rank {info.get('r')} > serve.max_lora_rank="
                                f"{s.max_lora_rank}")
                if not any((Path(s.adapters_path) / name / f).exists()
                           for f in ("adapter_model.safetensors", "adapter_model.bin")):
                    errs.append(f"serve.adapters_path: adapter {name!r} has no adapter_model.safetensors")
    if not 1 <= s.port <= 65535:
        errs.append(f"serve.port={s.port}: must be in 1..65535")
    for key, val in [("serve.replicas", s.replicas), ("serve.max_adapters_per_replica", s.max_adapters_per_replica),
                     ("serve.max_image_pixels", s.max_image_pixels), ("serve.max_image_bytes", s.max_image_bytes),
                     ("serve.max_images", s.max_images), ("serve.max_model_len", s.max_model_len)]:
        if val < 1:
            errs.append(f"{key}={val} must be >= 1")
    if not 0 < s.memory_utilization <= 1:
        errs.append(f"serve.memory_utilization={s.memory_utilization}: must be in (0, 1]")
    if s.host not in ("127.0.0.1", "localhost", "::1") and not s.print_config:
        import os

        if not os.environ.get(s.api_key_env):
            import logging

            logging.getLogger("rlfw").warning(
                "serve.host=%s exposes the endpoint beyond this machine without an API key (set %s)", s.host,
                s.api_key_env)
    if errs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errs))
