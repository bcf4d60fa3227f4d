"""Typed configuration schemas, registered in Hydra's ConfigStore.

Every YAML file under `conf/` extends one of these schemas through its defaults list
(`defaults: [base_algo, _self_]`), so a mistyped key or a wrongly typed override fails while the
config is composed, before anything runs. Cross-field checks that a schema cannot express live in
`validate()`, which the entry points call first; its messages say how to fix the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class TinyVLSpec:
    """Architecture of the tiny policy. Defaults give about 1.4M parameters (rlfw.models.tiny_vl builds it)."""

    hidden_size: int = 128
    """Width of the language model."""
    num_layers: int = 4
    """Decoder layers of the language model."""
    num_heads: int = 4
    """Attention heads (head_dim = hidden_size / num_heads)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 512
    """MLP width of the language model."""
    vision_hidden_size: int = 64
    """Width of the vision tower."""
    vision_depth: int = 2
    """Layers of the vision tower."""
    vision_heads: int = 2
    """Attention heads of the vision tower."""
    patch_size: int = 8
    """Vision patch side in pixels. Match it to the env's `cell_px` so one patch is one grid square."""
    spatial_merge_size: int = 1
    """Patches merged into one LM token per side (Qwen uses 2; 1 keeps one token per grid square)."""
    vocab_size: int = 1024
    """Target size of the byte-level BPE vocabulary (before special and action tokens)."""
    image_crop_px: int = 0
    """Pixels cut from each image side before the vision tower (e.g. one cell: a maze's outer wall
    never changes, so cropping it saves tokens). Stored with the processor."""


@dataclass
class AlgoConfig:
    """The RL algorithm: a GRPO variant is a choice of registered estimator, loss and reduction."""

    name: str = MISSING
    """Preset name, for logs."""
    module: Optional[str] = None
    """Python module imported (in the driver and every worker, before the config is checked) where
    your own estimator or loss registers itself with `rlfw.algos.register_adv_est` / `register_policy_loss`."""
    advantage_estimator: str = "grpo"
    """Registered advantage estimator (`rlfw.algos.list_adv_ests()`): grpo, dr_grpo, rloo."""
    policy_loss_type: str = "ppo"
    """Registered policy loss (`rlfw.algos.list_policy_losses()`): ppo (token ratio), gspo (sequence ratio)."""
    loss_reduction: str = "token-mean"
    """How token losses become one number: token-mean, seq-mean-token-mean, seq-mean-token-sum. With
    env.history=none every turn is its own sequence."""
    loss_max_tokens: Optional[int] = None
    """seq-mean-token-sum only: divide by this constant (Dr. GRPO uses the generation budget); None = no division."""
    n_samples_per_prompt: int = 8
    """Episodes sampled per task (the GRPO group size)."""
    tasks_per_step: int = 8
    """Tasks (prompts, i.e. GRPO groups) per training step: the step collects
    tasks_per_step * n_samples_per_prompt episodes."""
    tasks_per_optimizer_step: int = 8
    """Task groups per optimizer step (a mini-batch: all segments of that many groups); must divide
    tasks_per_step. Equal to it means one optimizer step per epoch."""
    sequences_per_forward: int = 16
    """Sequences (training segments) per forward/backward pass: gradients accumulate over the
    passes of one optimizer step. Memory, not the result, depends on it."""
    update_epochs: int = 1
    """Passes over each step's data."""
    target_kl: Optional[float] = None
    """PPO early stop: skip a step's remaining optimizer steps once a mini-batch's approx KL from the
    sampling policy exceeds this (e.g. 0.02); None never stops. Logged as `policy/skipped`."""
    old_logprobs: str = "trainer"
    """Where the PPO ratio's old log-probs come from when a step makes more than one optimizer step:
    trainer (an extra forward pass before updating) or rollout (the engine's sampling log-probs, free;
    they must match the trainer's, which `policy/rollout_logp_abs_diff` shows)."""
    step_advantage_weight: float = 0.0
    """Weight of GiGPO's step-level advantage added to each turn's episode-level one (0 = off; GiGPO
    uses 1). Turns of a group that saw the same observation are compared by their discounted
    return-to-go, normalised by the configured advantage_estimator (`rlfw.algos.step_advantages`).
    Needs env.history=none (one training sequence per turn)."""
    step_gamma: float = 0.95
    """Discount of the return-to-go used by the step-level advantage: a turn t steps before an
    outcome reward R gets gamma**t * R, so reaching the goal sooner is worth more."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    lr_schedule: str = "constant"
    """After warmup: constant, or cosine reaching lr * min_lr_ratio at the last training step."""
    warmup_steps: int = 0
    """Linear warmup, in training steps (the LR is set once per step, shared by its optimizer steps)."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; <= 0 disables clipping."""
    eps_clip_low: float = 0.2
    """Lower clip range: the ratio is clipped at 1 - eps_clip_low."""
    eps_clip_high: float = 0.2
    """Upper clip range (DAPO's clip-higher raises it): the ratio is clipped at 1 + eps_clip_high."""
    use_kl_loss: bool = False
    """Add kl_loss_coef * KL(policy || reference) to the loss. With LoRA the reference is the base model."""
    kl_loss_coef: float = 0.001
    """Weight of the KL term when use_kl_loss is true."""
    kl_estimator_type: str = "k3"
    """Per-token KL estimator: k1, k2 or k3 (Schulman's approximations)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 disables; the entropy is still logged)."""
    dynamic_sampling: str = "off"
    """DAPO dynamic sampling of groups whose rewards are all equal: off, drop, or resample."""
    max_sample_rounds: int = 3
    """With dynamic_sampling=resample: most rollout rounds per step to fill the batch."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; the trainer's log-probs use the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling of training rollouts (1.0 = off; keep 1.0 so engine log-probs are the policy's)."""


@dataclass
class EnvConfig:
    """The environment: any registered rlfw env id, plus what the rollout loop needs to know."""

    name: str = MISSING
    """Preset name, for logs and eval metric names (eval/<name>/pass_at_1)."""
    id: str = MISSING
    """Registered Gymnasium id, e.g. rlfw/Maze2D-v0 (`python -m envs` lists them)."""
    module: Optional[str] = None
    """Python module to import before gymnasium.make, where a user's env registers itself."""
    max_turns: int = 20
    """Turns per episode (a stop counts as a turn). Passed to the env and enforced by the loop."""
    history: str = "none"
    """What the model sees each turn: none (task prompt + current observation) or full (whole conversation)."""
    max_new_tokens: int = 8
    """Per-turn generation limit in tokens."""
    max_episode_tokens: int = 4096
    """Token limit of one training sequence (prompt + generated): the whole conversation with
    history=full, one turn with history=none. An episode whose next turn would not fit ends there."""
    eval_set: str = "heldout"
    """Greedy evaluation set: eval64 / eval64_hard (VisGym's fixed mazes) or heldout (env seeds from
    envs.eval_sets.HELD_OUT_SEED_START, any env)."""
    eval_size: int = 64
    """Episodes of the heldout set (fixed sets are always evaluated whole)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make (for envs without a typed schema of their own)."""


@dataclass
class MazeEnvConfig(EnvConfig):
    """VisGym-style 2D maze (rlfw/Maze2D-v0)."""

    difficulty: str = "easy"
    """easy (9x9 grid) or hard (11x11)."""
    cell_px: int = 8
    """Pixels per grid square; match the vision patch size so one patch is one square."""
    action_format: str = "visgym"
    """visgym: ('move', d) / ('stop', 'stop');  tagged: <action>right</action>."""


@dataclass
class LoraConfig:
    rank: int = 16
    """LoRA rank; 0 means full fine-tuning."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the LoRA path."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names (language model) that get adapters."""


@dataclass
class ModelConfig:
    name: str = MISSING
    """Preset name, for logs."""
    path: Optional[str] = None
    """Local checkpoint folder or hub id. None builds the tiny policy from `tiny` (random init)."""
    tiny: TinyVLSpec = field(default_factory=TinyVLSpec)
    """Architecture used when path is None."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Adapter settings."""
    dtype: str = "float32"
    """Training dtype: float32 or bfloat16."""


@dataclass
class ClusterConfig:
    name: str = MISSING
    """Preset name."""
    num_engines: int = 1
    """Rollout engine workers."""
    engine_backend: str = "transformers"
    """transformers (CPU or GPU) or vllm (GPU, optional extra)."""
    colocate_all: bool = True
    """Place the trainer and the engines on the same bundles; engines sleep while the trainer updates."""
    cpus_per_worker: int = 1
    """CPUs reserved per worker bundle."""
    gpus_per_worker: float = 0.0
    """GPUs reserved per worker bundle."""
    torch_threads: int = 1
    """torch.set_num_threads in each worker (colocated workers alternate, so they can share all cores)."""
    max_engine_restarts: int = 3
    """Times Ray restarts a dead rollout engine; the interrupted step's rollouts are redone."""
    max_trainer_restarts: int = 2
    """Times a dead trainer worker is replaced (with fresh engines) and the run resumed from its latest
    checkpoint; needs trainer.ckpt_interval > 0, else the run stops with the resume command."""
    placement_timeout_s: float = 60.0
    """Seconds to wait for the placement group before failing with a clear message."""
    ray_address: Optional[str] = None
    """Ray cluster to join; None starts Ray on this machine."""


@dataclass
class WandbConfig:
    mode: str = "offline"
    """online, offline or disabled."""
    project: str = "rlfw"
    """wandb project name."""


@dataclass
class LoggerConfig:
    name: str = MISSING
    """Preset name."""
    console: bool = True
    """Progress bar and per-step summary line."""
    tensorboard: bool = True
    """Write TensorBoard event files under the run folder."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases."""
    jsonl: bool = True
    """Write every metric to metrics.jsonl in the run folder."""


@dataclass
class TrainerConfig:
    total_steps: int = 20
    """Training steps (one rollout batch and its updates each)."""
    eval_interval: int = 5
    """Evaluate every this many steps (and before training); 0 disables."""
    eval_before_train: bool = True
    """Evaluate the starting policy."""
    output_dir: str = "${hydra:runtime.output_dir}"
    """Run folder (metrics, eval trajectories, checkpoints)."""
    lora_sync_path: str = "${trainer.output_dir}/lora_sync"
    """Shared storage through which the trainer hands the adapter to the engines after each step."""
    heldout_eval_size: int = 0
    """Also evaluate this many held-out mazes (our generator, seeds >= HELD_OUT_SEED_START) before and
    after training; 0 skips."""
    eval_save_episodes: int = 4
    """Evaluation episodes saved with images (GIF) per evaluation; all are saved as JSONL."""
    ckpt_interval: int = 0
    """Write a full checkpoint (weights, optimizer, LR schedule, step, RNG) every this many steps; 0 disables."""
    ckpt_path: str = "${trainer.output_dir}/checkpoints"
    """Folder or fsspec URI (e.g. s3://bucket/run) of global_step_N/ checkpoints and their pointer file."""
    ckpt_storage_options: dict[str, Any] = field(default_factory=dict)
    """fsspec options for ckpt_path, e.g. {endpoint_url: http://127.0.0.1:9000} for an S3-compatible store."""
    max_ckpts_to_keep: int = 2
    """Full checkpoints kept (oldest pruned); 0 keeps all."""
    hf_save_interval: int = 0
    """Export an inference-ready policy (adapter + processor) to export_path/global_step_N every this
    many steps (and at the last step); 0 disables."""
    export_path: str = "${trainer.output_dir}/exports"
    """Folder or fsspec URI (ckpt_storage_options apply) of the inference exports, apart from the
    checkpoints: pruning checkpoints never deletes an export."""
    max_exports_to_keep: int = 0
    """Inference exports kept (oldest pruned); 0 keeps all."""
    resume_mode: str = "none"
    """none (start fresh), latest (newest valid checkpoint under ckpt_path, else start fresh) or from_path."""
    resume_path: Optional[str] = None
    """A global_step_N folder, with resume_mode=from_path."""
    resume_ignore_config_changes: bool = False
    """Resume even if model keys (architecture, path, LoRA) differ from the checkpoint's."""


@dataclass
class Config:
    algo: AlgoConfig = MISSING
    """The RL algorithm (group `algo`): advantage estimator, loss, optimizer and sampling."""
    env: EnvConfig = MISSING
    """The environment (group `env`) and what the rollout loop needs to know about it."""
    model: ModelConfig = MISSING
    """The policy (group `model`): tiny architecture or checkpoint path, LoRA, dtype."""
    cluster: ClusterConfig = MISSING
    """Placement of the trainer and rollout engines on Ray (group `cluster`)."""
    logger: LoggerConfig = MISSING
    """Where metrics go (group `logger`): console, TensorBoard, Weights & Biases, metrics.jsonl."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The training loop: steps, evaluation, checkpoints and resuming."""
    seed: int = 0
    """Seed of every random stream (Python, NumPy, torch, environments)."""


@dataclass
class SFTConfig:
    """Supervised fine-tuning on the env's oracle (`python -m rlfw.sft`)."""

    steps: int = 3000
    """Optimizer steps."""
    batch_size: int = 64
    """Demonstration states per step."""
    states: str = "all_squares"
    """all_squares: a random open square of a fresh training maze per state, after one random move
    (so its feedback text is genuine); oracle_path: states along oracle walks (see noise)."""
    noise: float = 0.0
    """oracle_path only: probability of an off-path random move, so the policy learns to recover."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 100
    """Linear warmup."""
    decay_fraction: float = 0.25
    """Cosine decay to zero over this last fraction of the steps (constant before it)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    eval_interval: int = 250
    """Greedy evaluation (and a snapshot) every this many steps; 0 disables."""
    eval_size: int = 512
    """Held-out mazes (our generator, seeds >= envs.eval_sets.HELD_OUT_SEED_START) per evaluation."""
    stop_at_pass_at_1: Optional[float] = None
    """Stop once held-out pass@1 reaches this (e.g. 0.45 for a GRPO starting point); None runs all steps."""
    max_minutes: Optional[float] = None
    """Stop after this much wall time (a last evaluation and the checkpoint follow); None runs all steps.
    For comparisons at equal time, e.g. continuing SFT beside a GRPO run of the same length."""
    torch_threads: int = 2
    """torch.set_num_threads for the single SFT process."""
    output_dir: str = "${hydra:runtime.output_dir}"
    """Run folder: metrics, snapshots/step_N/, and the final checkpoint/ (a folder model.path= accepts)."""


@dataclass
class SFTRunConfig:
    env: EnvConfig = MISSING
    """The environment whose oracle gives the demonstrations (group `env`)."""
    model: ModelConfig = MISSING
    """The policy (group `model`); conf/sft.yaml sets model.lora.rank=0 (full fine-tuning)."""
    logger: LoggerConfig = MISSING
    """Where metrics go (group `logger`)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning: steps, batch, demonstration states, schedule, evaluation."""
    seed: int = 0
    """Seed of the model init, the demonstration stream and torch."""


def repo_root() -> str:
    """The folder holding conf/ and the shipped checkpoints (for `${rlfw_root:}` in YAML)."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1])


def register_configs() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("rlfw_root"):
        OmegaConf.register_new_resolver("rlfw_root", repo_root)
    from rlfw.cli_help import register_help_resolver  # imports this module: import it here, not at the top

    register_help_resolver()
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="base_sft_config", node=SFTRunConfig)
    cs.store(group="algo", name="base_algo", node=AlgoConfig)
    cs.store(group="env", name="base_env", node=EnvConfig)
    cs.store(group="env", name="base_maze_env", node=MazeEnvConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it."""


def _choice(value: str, valid: list[str], key: str) -> list[str]:
    return [] if value in valid else [f"{key}={value!r} is not one of {valid}"]


def _fixed_set_size_errors(env: EnvConfig) -> list[str]:
    """VisGym's fixed sets are 9x9 (eval64) and 11x11 (eval64_hard) mazes: the env must match."""
    if not isinstance(env, MazeEnvConfig) or env.eval_set not in ("eval64", "eval64_hard"):
        return []
    want = "easy" if env.eval_set == "eval64" else "hard"
    if env.difficulty != want or "size" in env.kwargs:
        return [f"env.eval_set={env.eval_set} holds {want} mazes; set env.difficulty={want} or env.eval_set=heldout"]
    return []


def validate(cfg: Config) -> None:
    """Check cross-field invariants up front; raise ConfigError listing every problem found."""
    from rlfw.algos import KL_KINDS, LOSS_AGG_MODES, import_algo_module, list_adv_ests, list_policy_losses

    a, e, c = cfg.algo, cfg.env, cfg.cluster
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
    errs += _choice(a.lr_schedule, ["constant", "cosine"], "algo.lr_schedule")
    errs += _choice(e.history, ["none", "full"], "env.history")
    errs += _choice(c.engine_backend, ["transformers", "vllm"], "cluster.engine_backend")
    errs += _choice(cfg.model.dtype, ["float32", "bfloat16"], "model.dtype")
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
                     ("cluster.num_engines", c.num_engines), ("cluster.torch_threads", c.torch_threads),
                     ("trainer.total_steps", cfg.trainer.total_steps)]:
        if val < 1:
            errs.append(f"{key}={val} must be >= 1")
    for key, val in [("cluster.max_engine_restarts", c.max_engine_restarts),
                     ("cluster.max_trainer_restarts", c.max_trainer_restarts)]:
        if val < 0:
            errs.append(f"{key}={val} must be >= 0")
    if a.lr <= 0:
        errs.append(f"algo.lr={a.lr} must be > 0")
    if a.warmup_steps < 0 or not 0 <= a.min_lr_ratio <= 1:
        errs.append(f"need algo.warmup_steps >= 0 and 0 <= algo.min_lr_ratio <= 1 (got {a.warmup_steps}, {a.min_lr_ratio})")
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
        errs.append("cluster.engine_backend=vllm is not available yet; use cluster.engine_backend=transformers")
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
    for key, val in [("sft.steps", s.steps), ("sft.batch_size", s.batch_size), ("sft.eval_size", s.eval_size),
                     ("sft.torch_threads", s.torch_threads)]:
        if val < 1:
            errs.append(f"{key}={val} must be >= 1")
    if not 0 <= s.noise < 1:
        errs.append(f"sft.noise={s.noise} must be in [0, 1)")
    if s.noise and s.states != "oracle_path":
        errs.append("sft.noise applies to sft.states=oracle_path only; set sft.states=oracle_path or sft.noise=0")
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
    if errs:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errs))
