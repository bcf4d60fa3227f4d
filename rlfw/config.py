"""Typed configuration schemas, registered in Hydra's ConfigStore.

Every YAML file under `conf/` extends one of these schemas through its defaults list
(`defaults: [base_algo, _self_]`), so a mistyped key or a wrongly typed override fails while the
config is composed, before anything runs. Cross-field checks that a schema cannot express live in
`rlfw.validation.validate()`, which the entry points call first; its messages say how to fix the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

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
    pg_coef: float = 1.0
    """Weight of the policy-gradient term (the registered policy loss on the advantages): 1 is the
    algorithm as published; 0 keeps the rest of the step (its own rollouts) with the oracle term
    alone beside any KL and entropy terms: DAgger on the policy's states, what the outcome reward's
    gradient adds beside it. Needs oracle_coef > 0 at 0. `policy/loss` stays the unweighted term.
    At 0 with entropy_coef=0, no KL term and target_kl=null nothing reads the sampled turns, so the
    update runs no forward pass over them (no `policy/loss`), only over the oracle segments."""
    step_advantage_weight: float = 0.0
    """Weight of GiGPO's step-level advantage added to each turn's episode-level one (0 = off; GiGPO
    uses 1). Turns of a group that saw the same observation are compared by their discounted
    return-to-go, normalised by the configured advantage_estimator (`rlfw.algos.step_advantages`).
    Needs env.history=none (one training sequence per turn)."""
    step_gamma: float = 0.95
    """Discount of the return-to-go used by the step-level advantage: a turn t steps before an
    outcome reward R gets gamma**t * R, so reaching the goal sooner is worth more."""
    oracle_coef: float = 0.0
    """Weight of a DAgger-style term (0 = off; `rlfw.rollout.oracle`): each mini-batch's loss adds
    oracle_coef times the mean negative log-likelihood, per token, of the oracle's action + EOS
    after the turn's own prompt (built like `rlfw.rollout.demos.to_segment`) over its labelled turns (see
    oracle_states). Labels are the env's best_action() at the state the policy saw, so the env
    needs one. Needs env.history=none. Logged: policy/oracle_loss, train/oracle_states (labelled
    turns used), train/oracle_disagreement (share of turns whose move was not the oracle's)."""
    oracle_states: str = "errors"
    """Turns the oracle term labels: errors (the policy's parsed action differed from the oracle's;
    an invalid reply counts), first_error (only each episode's first such turn: the state where a
    greedy policy leaves the path; the cheapest) or all (every visited turn; one more forward pass
    per turn)."""
    oracle_fresh_states: int = 0
    """Also label this many states of fresh training mazes per step and add them to the oracle
    term beside the visited ones (0 = off; needs oracle_coef > 0): rlfw.sft's all_squares states
    (a random open square after one random move, or a start state; `rlfw.rollout.demos`), spread
    evenly over the step's groups so each mini-batch gets its share, and drawn from (seed, step)
    so a resumed run repeats them. The coverage continued SFT has, at one forward-backward each;
    beside oracle_states it tells whether the policy's own states add weight where it errs or
    only coverage. Logged: train/oracle_fresh_states."""
    oracle_fresh_junction_fraction: float = 0.0
    """oracle_fresh_states only: this fraction of the fresh states are junctions (three or four open
    neighbours, entered by a move), as sft.junction_fraction draws them for SFT; 0 keeps the plain
    all_squares draw (about 7% junctions). The RL stage's first wrong moves are 2-3x as frequent
    per square at junctions as in corridors, and the oracle term on visited states leaves that rate
    where the SFT stage had it (experiments/maze_from_sft/levers.md)."""
    oracle_fresh_from: float = 0.0
    """oracle_fresh_states only: the fraction of the run done (steps out of trainer.total_steps, or
    minutes out of trainer.max_minutes on the minutes schedule) from which the fresh states join;
    before it a step trains on the visited states alone, as without them. 0 = from the first step.
    The fresh junction states lower the junction errors and raise the corridor ones that the first
    errors' labels cut early (experiments/maze_from_sft/levers.md); starting them late leaves those
    first steps as they were. Logged: train/oracle_fresh_states on the steps that have them."""
    oracle_tag_weights: Dict[str, float] = field(default_factory=dict)
    """Weight of the oracle term's labels on visited states by the kind of state they label (the env's
    `state_tag()`, one of its `state_tags`; the mazes: junction or corridor), e.g.
    `+algo.oracle_tag_weights.junction=3` (Hydra's `+` adds the key); a tag not named weighs 1, and
    so do fresh states (oracle_fresh_states), and a tag at 0 drops its labels before their forward
    pass. The main job (experiment=maze_sft_then_dagger) sets junction: 10; there
    `'~algo.oracle_tag_weights.junction'` removes it. The term stays a mean, weighted per token, so this moves the
    term's weight between kinds of state, not its size. Junctions are about a fifth of a route's
    squares, so most of the term's labels are corridor ones, and the RL stage leaves the error rate
    per junction where its SFT stage had it or above (experiments/maze_from_sft/levers.md).
    Logged: train/oracle_weight_mean (the labels' mean weight: with {junction:w} alone, 1 + (w - 1)
    times the junctions' share of the labels)."""
    oracle_tag_states: list[str] = field(default_factory=list)
    """Also label every visited state of these kinds (the env's `state_tag()`), beside the turns
    oracle_states chooses, e.g. `algo.oracle_tag_states=[junction]`: first errors plus every junction
    the policy passed, right or wrong (a turn chosen twice is labelled once). The RL stage's first-error
    labels reach a junction only where the policy already went wrong there; these keep the ones it
    gets right labelled too, as SFT's fresh junction states do. Each costs a forward pass."""
    restart_fraction: float = 0.0
    """Share of each rollout round's groups started not from a fresh maze but from the state just
    before the first wrong move (action != the oracle's) of a recent training episode, with that
    episode's remaining turns and previous feedback (0 = off; `rlfw.rollout.restarts`). The buffer
    is saved in checkpoints, so a resumed run repeats the same restarts. Needs env.history=none and
    an env with best_action() and layout(). Logged: train/restart_groups, train/restart_buffer."""
    restart_buffer_size: int = 64
    """Most recent distinct first-wrong-move states kept for restarts (the oldest are dropped)."""
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
    attn_implementation: Optional[str] = None
    """transformers' attention kernel for the policy (eager, sdpa, ...); None keeps the checkpoint's
    (sdpa). eager is faster for tiny_vl on CPU, whose sequences are a hundred tokens and whose vision
    tower otherwise makes one sdpa call per image (scripts/bench.py, section 3)."""
    train_autocast: Optional[str] = None
    """bfloat16: the training forward and backward run under torch.autocast (matmuls in bf16; weights,
    gradients and AdamW stay in model.dtype). auto: bfloat16 where the training device has native bf16
    (a CUDA GPU that supports it; a CPU with AVX512_BF16 or AMX), plain model.dtype elsewhere, since an
    AVX2-only CPU emulates bf16 matmuls many times slower (rlfw.models.native_bf16). None: plain
    model.dtype. Generation is not affected (model.engine_autocast)."""
    engine_autocast: Optional[str] = None
    """The same choice for generation in rlfw's transformers engine (rollouts and evaluations): its
    prefill and decode run under torch.autocast in bf16; sampling and the log-probs it returns are
    float32 over the bf16 logits. auto: bfloat16 where the engine's device has native bf16. None:
    plain model.dtype. The vLLM engine has its own dtype (cluster.vllm)."""
    compile: bool = False
    """torch.compile the language model for training (dynamic shapes; generation and the vision tower
    stay eager). The first two training steps pay for it, about 2 minutes for tiny_vl on 2 cores."""


@dataclass
class VLLMConfig:
    """Settings of the vLLM rollout engine (cluster.engine_backend=vllm; `rlfw.rollout.vllm_engine`)."""

    memory_utilization: float = 0.25
    """Fraction of the device's memory vLLM may take for weights and KV cache (vLLM's
    gpu_memory_utilization; on the CPU backend, of host memory). Colocated with a trainer on one
    GPU, leave it room: the reference recipe uses 0.45."""
    max_lora_rank: Optional[int] = None
    """Largest LoRA rank the engine accepts, one of vLLM's supported ranks (1, 8, 16, 32, 64, 128,
    256, 320, 512) and >= model.lora.rank; None takes the smallest supported rank >= model.lora.rank."""
    tensor_parallel_size: int = 1
    """GPUs one engine is sharded over (1 on CPU)."""
    max_num_seqs: int = 256
    """Most sequences one engine decodes at once; larger batches queue."""
    enforce_eager: bool = True
    """Run without CUDA graphs / compilation: fast start (on CPU, and for short runs); set false on
    a GPU for faster decoding after a slower start."""
    sleep_level: int = 1
    """vLLM sleep mode while the colocated trainer updates: 1 frees the KV cache and keeps the base
    weights (right with LoRA), 0 never sleeps. Needs a backend with sleep mode (CUDA)."""


@dataclass
class FSDPConfig:
    """FSDP2 settings of the training ranks (cluster.trainer_ranks > 1; `rlfw.distributed.ranks`)."""

    mixed_precision: bool = True
    """bf16 parameters and activations with fp32 gradient reduction, on CUDA only (on CPU fp32 was
    faster for small models)."""
    activation_checkpointing: bool = False
    """Recompute each transformer block in the backward pass: less activation memory, more compute."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in host memory (CUDA only)."""
    timeout_s: float = 600.0
    """How long a collective waits for a missing rank before the group fails (and the run resumes)."""


@dataclass
class ClusterConfig:
    name: str = MISSING
    """Preset name."""
    num_engines: int = 1
    """Rollout engine workers."""
    engine_backend: str = "transformers"
    """transformers (rlfw's own engine, CPU or GPU) or vllm (the vLLM engine: `pip install -e .[vllm]`
    on a GPU machine, `bash scripts/setup.sh --vllm` for the CPU build here)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """vLLM engine settings (used with engine_backend=vllm)."""
    trainer_ranks: int = 1
    """Training processes in one torch.distributed group, the policy sharded over them with FSDP2
    (gloo on CPU, nccl on GPU). Rank i shares bundle i with engine i when colocate_all."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings (used with trainer_ranks > 1)."""
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
    metrics_export_port: Optional[int] = None
    """Port where the Ray that rlfw starts here (no ray_address) serves its metrics, rlfw's gauges
    included, for Prometheus; None lets Ray pick a free one. A port in use is reported in run.log and
    Ray picks another: the export never stops training. On a cluster, `ray start --metrics-export-port`."""


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
    ray_metrics: bool = True
    """Export every metric as a Ray gauge (`rlfw_<name>`, tagged with the run), so on a Ray cluster it
    reaches Prometheus through Ray's metrics export port and shows on Grafana beside Ray's own."""


@dataclass
class TrainerConfig:
    total_steps: int = 20
    """Training steps (one rollout batch and its updates each)."""
    max_minutes: Optional[float] = None
    """Stop after the first step that ends past this much wall time (timing/elapsed_min, which runs on
    across resumes); that step is then the last: its evaluation (held-out included), checkpoint and
    export follow. The LR schedule still spans total_steps unless schedule=minutes. None runs all
    steps. For comparisons at equal time, e.g. beside continued SFT (sft.max_minutes)."""
    schedule: str = "steps"
    """steps: algo.lr_schedule spans total_steps. minutes: it spans max_minutes of wall time (the
    fraction spent when each step's update starts, which runs on across resumes), so the cosine ends
    where the time does on a fast machine and a slow one, and total_steps is only a cap; set it well
    above what the time holds. A resumed run then repeats its steps but not their exact LRs."""
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
class SweepConfig:
    """What a job of a Hydra multirun (`python -m rlfw.run -m ...`) returns to its sweeper."""

    objective: Optional[str] = "eval/all/pass_at_1"
    """Metric (any metrics.jsonl key) whose last logged value the run returns: the value a sweeper that
    optimizes, like Optuna's (`experiment=sweep_optuna`), maximizes. In a multirun a job that never
    logged it fails, saying which metrics it did log (an eval/ metric needs trainer.eval_interval > 0,
    checked before training); null returns nothing."""


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
    junction_fraction: float = 0.0
    """all_squares only: this fraction of the states are junctions (three or four open neighbours),
    each entered by a move from a random neighbour; the rest are drawn as before (0 = off, the
    draw unchanged). The plain draw gives about 7% junctions and 26% dead ends, where a policy's
    route crosses about 18% junctions and 5% dead ends, and its first wrong moves per square are
    about 2-3x as frequent at junctions as in corridors (experiments/maze_from_sft/levers.md)."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 100
    """Linear warmup."""
    decay_fraction: float = 0.25
    """Cosine decay to zero over this last fraction of the steps (constant before it), or of
    max_minutes with schedule=minutes."""
    schedule: str = "steps"
    """steps: the LR schedule spans sft.steps. minutes: it spans sft.max_minutes of wall time and the
    run ends there (sft.steps is then only a cap), so one setting fills the same time on a fast
    machine and a slow one; the step count reached is logged. For equal-time comparisons and
    time-budgeted presets."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    eval_interval: int = 250
    """Greedy evaluation (and a snapshot) every this many steps and at the last; 0 disables them all,
    the time limit's included (an SFT stage before RL, whose step-0 evaluation scores it)."""
    eval_size: int = 512
    """Held-out mazes (our generator, seeds >= envs.eval_sets.HELD_OUT_SEED_START) per evaluation."""
    stop_at_pass_at_1: Optional[float] = None
    """Stop once held-out pass@1 reaches this (e.g. 0.45 for a GRPO starting point); None runs all steps."""
    max_minutes: Optional[float] = None
    """Stop after this much wall time (a last evaluation unless eval_interval=0, and the checkpoint); None
    runs all steps.
    For comparisons at equal time, e.g. continuing SFT beside a GRPO run of the same length."""
    torch_threads: int = 2
    """torch.set_num_threads for the single SFT process."""
    compile: Optional[bool] = None
    """torch.compile the training forward of this SFT run (what model.compile does), in place of
    model.compile; None follows model.compile. For an SFT stage before RL it compiles the stage alone:
    a cold compile of about 85 s on 2 cores pays back over a long stage, while RL after it stays
    as model.compile says (experiment=maze_sft_then_dagger, experiments/maze_from_sft/levers.md)."""
    ckpt_interval: int = 100
    """Write the run's state (weights, AdamW, LR schedule, the demonstration stream's position, step,
    RNG, wall time so far) to output_dir/train_state/global_step_N every this many steps, the older
    one removed once the new one is whole; a killed run continues from it (resume_mode). 0 disables.
    For the tiny policy about 20 MB and a fraction of a second. Removed when the final checkpoint is
    written."""
    resume_mode: str = "none"
    """none: start fresh. latest: continue from the newest valid state under output_dir/train_state
    (a killed run's; bit for bit with schedule=steps), start fresh if there is none, and return at
    once if output_dir/checkpoint is already written. A preset's SFT stage resumes when its RL run
    is resumed."""
    output_dir: str = "${hydra:runtime.output_dir}"
    """Run folder: metrics, snapshots/step_N/, train_state/ while it runs, and the final checkpoint/
    (a folder model.path= accepts)."""


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
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """What the run returns to a Hydra sweeper (`-m`): the objective an Optuna study maximizes."""
    sft_stage: Optional[SFTConfig] = None
    """Supervised fine-tuning on the env's oracle before RL, in the same run (`rlfw.sft.run_sft_stage`):
    model.path is fine-tuned in full (LoRA off) with these settings, its checkpoint written to
    sft_stage.output_dir, and RL starts from that checkpoint with model.lora. A rerun in the same
    trainer.output_dir (a resubmitted job) reuses a finished stage's checkpoint and, with
    trainer.resume_mode=latest, continues an interrupted one from its last state
    (sft_stage.ckpt_interval). None: RL starts from model.path. Turn it on with the group
    `sft_stage=oracle` (conf/sft_stage/oracle.yaml), then set its keys (`sft_stage.steps=300`);
    `~sft_stage` turns a preset's stage off. Preset: experiment=maze_sft_then_dagger."""
    seed: int = 0
    """Seed of every random stream (Python, NumPy, torch, environments)."""


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


@dataclass
class EvalConfig:
    """Evaluation of a trained policy (`python -m rlfw.eval`), through rlfw.evaluate as in training."""

    sets: Optional[list[str]] = None
    """Evaluation sets: eval64 / eval64_hard (VisGym's fixed 9x9 / 11x11 mazes; the env's difficulty
    must match) and heldout (eval.heldout_size mazes from envs.eval_sets.HELD_OUT_SEED_START). None
    means [eval64], or no named set when eval.layouts is given. env.eval_set is not used here."""
    layouts: Optional[str] = None
    """A JSON file holding a list of layout records (grid, agent, target, optional seed), e.g. a few
    copied from envs/data/visgym_maze2d_seeds_0_63.json; evaluated after eval.sets as a set named
    after the file (its stem)."""
    heldout_size: int = 512
    """Mazes of the heldout set (rlfw.sft's held-out evaluation uses 512)."""
    adapter: Optional[str] = None
    """A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors: an rlfw.run export
    exports/global_step_N/ or a lora_sync/vN/) loaded on top of model.path; None evaluates model.path as it is."""
    n: int = 1
    """Episodes per maze. n > 1 samples them (eval.temperature > 0) and reports pass@n, the fraction
    of mazes with at least one success, beside pass@1, the mean success."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy decoding (as in-training evaluation)."""
    top_p: float = 1.0
    """Nucleus sampling mass when eval.temperature > 0 (1.0 = off)."""
    batch_size: int = 64
    """Episodes played at once (one engine batch); the progress bar advances per batch. 64 plays
    eval64 in one batch, exactly as in-training evaluation does."""
    save_gifs: int = 4
    """Episodes per set saved as captioned GIFs (every episode goes to episodes.jsonl)."""
    device: str = "cpu"
    """cpu or cuda."""
    torch_threads: int = 2
    """torch.set_num_threads for the evaluation process."""
    base_url: Optional[str] = None
    """An OpenAI-compatible API to evaluate instead of an in-process model, e.g.
    http://127.0.0.1:8000/v1 (`python -m rlfw.serve`). model.path then only gives the policy's
    tokenizer and observation crop (rlfw_processor.json), not weights."""
    model: Optional[str] = None
    """The served model to request at eval.base_url: <base id>, or <base id>:<adapter name> for an
    adapter of Ray Serve LLM's dynamic LoRA loading."""
    concurrency: int = 8
    """Requests in flight to eval.base_url (each turn's batch is sent this many at a time)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the endpoint's API key (never put a key in a config: config.yaml
    is saved with the results); unset sends none."""
    output_dir: str = "${hydra:runtime.output_dir}"
    """Folder of metrics.json (every set's metrics, the policy, the command), config.yaml and one
    folder per set (episodes.jsonl, episode_NNN.gif)."""


@dataclass
class EvalRunConfig:
    env: EnvConfig = MISSING
    """The environment the policy plays (group `env`): grid size, turn and token limits."""
    model: ModelConfig = MISSING
    """The policy (group `model`): model.path is evaluated as it is (model.lora is not applied; a
    trained adapter comes with eval.adapter). model.path=null builds a random-init tiny_vl."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """What to evaluate on, how many samples, and where the results go."""
    seed: int = 0
    """Seed of sampling (eval.temperature > 0) and of a random-init model."""


@dataclass
class ServeConfig:
    """Serving a base policy and its adapters with Ray Serve LLM (`python -m rlfw.serve`)."""

    model_id: Optional[str] = None
    """The base model's id at the endpoint (`model="<model_id>"`; adapters are
    `<model_id>:<adapter name>`). None: the name of the model.path folder."""
    adapters_path: Optional[str] = None
    """Where adapters live, one folder per adapter name (`<name>/adapter_config.json` + safetensors,
    as `python -m rlfw.serve.export` writes them): s3://, gs://, abfss:// or azure:// (read by
    Ray Serve LLM on first request, then cached), or a local folder, which rlfw serves to Ray from an
    S3 server of its own on 127.0.0.1 (Ray Serve LLM reads only remote storage). None: the base only."""
    max_lora_rank: Optional[int] = None
    """The largest adapter rank the engine accepts. None: the largest rank among the adapters found
    in a local serve.adapters_path, else model.lora.rank."""
    max_adapters_per_replica: int = 4
    """Adapters a replica holds at once (least recently used ones are evicted)."""
    replicas: int = 1
    """Engine replicas (one per GPU on a cluster; on this CPU, 1)."""
    host: str = "127.0.0.1"
    """Address the HTTP endpoint binds. Loopback unless you mean to expose it (then set an API key)."""
    port: int = 8000
    """HTTP port of the endpoint (/v1/models, /v1/chat/completions, ...)."""
    api_key_env: str = "RLFW_SERVE_API_KEY"
    """Environment variable holding the API key requests must send (Authorization: Bearer <key>);
    unset: no key is asked for. The key itself never goes in a config."""
    max_image_pixels: int = 1048576
    """Largest image accepted, in pixels (413 above); rlfw's maze images are a few thousand."""
    max_image_bytes: int = 4194304
    """Largest image accepted, in decoded bytes (413 above)."""
    max_images: int = 8
    """Images accepted in one request (413 above)."""
    allow_remote_images: bool = False
    """Let requests name http(s) image URLs, which the server then fetches; off: only base64 data: URLs."""
    accelerator: str = "auto"
    """cpu, gpu or auto (gpu when torch sees CUDA)."""
    memory_utilization: float = 0.2
    """vLLM's gpu_memory_utilization: the share of GPU memory (on vLLM's CPU backend, of host memory)
    for weights and KV cache."""
    max_model_len: int = 4096
    """Longest prompt plus reply, in tokens (bounds the KV cache)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """More vLLM engine arguments, passed through (e.g. tensor_parallel_size)."""
    num_cpus: Optional[int] = None
    """Logical CPUs of the local Ray instance rlfw starts (the ingress and each replica reserve one).
    None: 2 + 2 per replica. Ignored with serve.ray_address."""
    ray_address: Optional[str] = None
    """A running Ray cluster to deploy on (auto, or ray://host:10001); None starts Ray on this machine."""
    print_config: Optional[str] = None
    """Write the application as a Ray Serve config (serve_config.yaml, for `serve deploy`) and a
    KubeRay RayService manifest (rayservice.yaml) into this folder, then exit without serving."""
    image: str = "rlfw:0.1.0"
    """Container image of the RayService manifest (deploy/docker/Dockerfile)."""
    startup_timeout_s: float = 600.0
    """How long to wait for the application to come up before giving up with its status."""


@dataclass
class ServeRunConfig:
    model: ModelConfig = MISSING
    """The base policy (group `model`): model.path is served; model.dtype its dtype."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """Endpoint, adapters, limits and engine settings."""
    seed: int = 0
    """vLLM's seed (requests with their own seed sample from it alone)."""


def repo_root() -> str:
    """The folder holding conf/ and the shipped checkpoints (for `${rlfw_root:}` in YAML)."""
    return str(Path(__file__).resolve().parents[1])


def rl_start_model(cfg: Config | SFTRunConfig | EvalRunConfig) -> str:
    """The model folder a run's policy starts from: for an rlfw.run run with an SFT stage
    (Config.sft_stage), the stage's checkpoint, not model.path. Whatever rebuilds a run's policy
    from its saved config (an adapter's base: scripts/merge_adapter.py, failure_analysis.py) uses it."""
    stage = getattr(cfg, "sft_stage", None)
    return str(Path(stage.output_dir) / "checkpoint") if stage is not None else cfg.model.path


def sft_stage_config(cfg: Config) -> SFTRunConfig:
    """The SFT run that `cfg.sft_stage` describes: the RL run's env, logger and seed, and its model
    fine-tuned in full (LoRA rank 0, as `python -m rlfw.sft` does); resumed when the run is
    (trainer.resume_mode other than none)."""
    from dataclasses import replace

    model = replace(cfg.model, lora=replace(cfg.model.lora, rank=0))
    sft = cfg.sft_stage
    if cfg.trainer.resume_mode != "none":  # a resubmitted job continues an interrupted stage too
        sft = replace(sft, resume_mode="latest")
    return SFTRunConfig(env=cfg.env, model=model, logger=cfg.logger, sft=sft, seed=cfg.seed)


def register_configs() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("rlfw_root"):
        OmegaConf.register_new_resolver("rlfw_root", repo_root)
    from rlfw.cli_help import register_help_resolver  # imports this module: import it here, not at the top

    register_help_resolver()
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="base_sft_config", node=SFTRunConfig)
    cs.store(name="base_eval_config", node=EvalRunConfig)
    cs.store(name="base_serve_config", node=ServeRunConfig)
    cs.store(group="algo", name="base_algo", node=AlgoConfig)
    cs.store(group="env", name="base_env", node=EnvConfig)
    cs.store(group="env", name="base_maze_env", node=MazeEnvConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)
