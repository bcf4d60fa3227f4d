"""The training side of the policy: log-probs, the clipped policy-gradient update, weight export.

`PolicyTrainer` owns the model (LoRA-wrapped or full), AdamW and the LR schedule. One `update`
call is one training step's worth of optimisation: it recomputes the old log-probs (unless the step
is a single on-policy optimizer step) and the reference log-probs for the KL term, then runs
`update_epochs` passes of mini-batches, each a few micro-batches of gradient accumulation. Losses
are weighted across micro-batches so that token-mean and sequence-mean reductions are exact over
the whole mini-batch. Log-probs are taken at the sampling temperature, like the engine's.

With `algo.oracle_coef > 0` a mini-batch also holds its groups' oracle segments (`TrainBatch.oracle`,
`rlfw.rollout.oracle`): the loss adds oracle_coef times their negative log-likelihood, a token mean
over all of the mini-batch's labelled turns (copies counted, one forward pass per distinct segment;
each turn weighted by its state's tag, `algo.oracle_tag_weights`),
weighted across micro-batches and ranks like the policy term so that the split does not change it.
With the term off there are no oracle segments and no extra forward pass. `algo.pg_coef` weighs the
policy-gradient term (0 keeps the oracle, KL and entropy terms alone). Where nothing reads the sampled
turns' log-probs (pg_coef 0 with no entropy or KL term and no `target_kl`: DAgger alone) the update
runs no forward pass over them, only over the oracle segments.

With several training ranks (`rlfw.distributed.ranks`) each rank runs its share of every chunk of
work, weighted by the whole mini-batch's totals, and the gradients are summed, so the update is the
one-rank update; checkpoints and published weights are gathered whole (any rank count resumes).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import torch

from rlfw.algos import aggregate, entropy_from_logits, get_policy_loss, kl_estimate, masked_mean
from rlfw.config import AlgoConfig, FSDPConfig
from rlfw.distributed.ranks import Ranks
from rlfw.models import DTYPES, compile_language_model
from rlfw.models.processing import PolicyProcessor, collate
from rlfw.models.last_layer import layer_kwargs
from rlfw.models.weights import save_policy_weights
from rlfw.rollout.types import Segment, TrainBatch, segment_key
from rlfw.schedule import lr_factor, lr_factor_by_time


class PolicyTrainer:
    def __init__(self, model: torch.nn.Module, processor: PolicyProcessor, algo: AlgoConfig,
                 total_steps: int, seed: int = 0, device: str = "cpu", ranks: Ranks | None = None,
                 fsdp: FSDPConfig | None = None, autocast: str | None = None, compile: bool = False):
        self.ranks = ranks or Ranks(device=device)
        self.processor = processor
        self.algo = algo
        self.total_steps = total_steps
        self.device = torch.device(device)
        self.loss_fn = get_policy_loss(algo.policy_loss_type)
        self.is_peft = hasattr(model, "disable_adapter")
        model = model.to(device)
        # Full fine-tuning with a KL term needs a frozen copy; LoRA just disables the adapter.
        self.ref_model = None
        if algo.use_kl_loss and not self.is_peft:
            self.ref_model = self.ranks.shard(copy.deepcopy(model).eval().requires_grad_(False), FSDPConfig())
        self.model = self.ranks.shard(model, fsdp or FSDPConfig())
        if compile:  # model.compile; this model never generates (the engines hold their own copies)
            compile_language_model(self.model)
        self.autocast = autocast  # model.train_autocast
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=algo.lr, weight_decay=algo.weight_decay)
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer_steps = 0
        self.dedup = True  # one forward pass per distinct segment (see _duplicates); off only to measure it

    # -- forward --------------------------------------------------------------------------------
    def _forward(self, segments: list[Segment], model: torch.nn.Module | None = None, want_entropy: bool = False):
        return sequence_logprobs(model or self.model, self.processor, segments, want_entropy,
                                 self.algo.temperature, self.autocast)

    @torch.no_grad()
    def logprobs(self, segments: list[Segment], reference: bool = False) -> list[torch.Tensor]:
        """Log-probs [T-1] per segment under the current (or reference) policy, no grad."""
        out: list[torch.Tensor | None] = [None] * len(segments)
        self.model.eval()
        keys = [segment_key(s) for s in segments]
        groups = self._duplicates(list(range(len(segments))), keys)
        mine: dict[int, torch.Tensor] = {}
        for chunk, real in self.ranks.share(_chunks(groups, self.algo.sequences_per_forward)):
            segs = [segments[group[0]] for group in chunk]
            if reference and self.is_peft:
                with self.model.disable_adapter():
                    logp, _, _ = self._forward(segs)
            else:
                logp, _, _ = self._forward(segs, self.ref_model if reference else None)
            if real:
                for row, (group, s) in enumerate(zip(chunk, segs)):
                    mine[group[0]] = logp[row, : len(s.token_ids) - 1].clone()
        if self.ranks.world > 1:  # every rank needs every segment's log-probs
            parts = self.ranks.gather({i: lp.cpu() for i, lp in mine.items()})
            mine = {i: lp.to(self.device) for part in parts for i, lp in part.items()}
        for group in groups:
            for i in group:
                out[i] = mine[group[0]]
        return out

    def _duplicates(self, idx: list[int], keys: list[tuple]) -> list[list[int]]:
        """`idx` grouped by identical segments (same tokens, loss mask and images), first-seen order.

        A memoryless policy revisits states: within a step many turns repeat the same prompt and
        reply (in our maze runs 500+ turns held about 200 distinct ones), so one forward pass per
        distinct segment serves all its copies. Copies keep their own advantages, so the loss is
        exactly the one over all segments.
        """
        if not self.dedup:
            return [[i] for i in idx]
        groups: dict[tuple, list[int]] = {}
        for i in idx:
            groups.setdefault(keys[i], []).append(i)
        return list(groups.values())

    # -- update ---------------------------------------------------------------------------------
    def lr_at(self, step: int, progress: float | None = None) -> float:
        """The learning rate of training step `step` (1-based), shared by all its optimizer steps.
        `progress`, the fraction of a time budget spent (trainer.schedule=minutes), puts the cosine on
        wall time instead of on total_steps."""
        a = self.algo
        if progress is not None:
            decay_fraction = 1.0 if a.lr_schedule == "cosine" else 0.0
            return a.lr * lr_factor_by_time(step - 1, progress, a.warmup_steps, decay_fraction, a.min_lr_ratio)
        decay = self.total_steps - a.warmup_steps if a.lr_schedule == "cosine" else 0
        return a.lr * lr_factor(step - 1, self.total_steps, a.warmup_steps, decay, a.min_lr_ratio)

    def reads_sampled_turns(self) -> bool:
        """Whether the update needs the sampled turns' log-probs: for the policy-gradient, entropy or KL
        term, or for target_kl's early stop. Not with algo.pg_coef=0 and none of those (DAgger alone),
        where a step's forward and backward passes cover its oracle segments only."""
        a = self.algo
        return bool(a.pg_coef or a.entropy_coef or a.use_kl_loss or a.target_kl is not None)

    def update(self, batch: TrainBatch, step: int, seed: int = 0, lr_progress: float | None = None) -> dict[str, float]:
        """Training step `step` (1-based): `update_epochs` passes of mini-batches over the batch's segments.

        Mini-batches are cut at task-group boundaries (tasks_per_optimizer_step groups each). `seed`
        fixes the mini-batch order, so a resumed run repeats a step exactly. The LR is a function of
        `step` alone (`rlfw.schedule`), or of `lr_progress` too when given (trainer.schedule=minutes). A mini-batch whose loss or gradient is not finite makes no
        optimizer step and ends the update (`nonfinite` = 1); the caller stops before publishing.
        """
        a = self.algo
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step, lr_progress)
        segments, advantages, groups = batch.segments, batch.advantages, batch.groups
        self.generator.manual_seed(seed)
        torch.manual_seed(seed)  # anything stochastic inside the forward pass repeats on resume
        unique_groups = sorted(set(groups))
        n_minis = max(1, len(unique_groups) // a.tasks_per_optimizer_step)
        # One optimizer step on fresh samples is exactly on-policy: the old log-probs are the current
        # ones (ratio 1, gradient = policy gradient), so skip the extra forward pass.
        sampled = self.reads_sampled_turns()
        if a.update_epochs * n_minis == 1 or not sampled:
            old = None
        elif a.old_logprobs == "rollout":
            old = [torch.tensor(s.logprobs[1:], dtype=torch.float32, device=self.device) for s in segments]
        else:
            old = self.logprobs(segments)
        ref = self.logprobs(segments, reference=True) if a.use_kl_loss else None
        keys = [segment_key(s) for s in segments]  # identical turns share a forward pass (_duplicates)
        oracle_keys = [segment_key(s) for s in batch.oracle]
        oracle_weights = batch.oracle_weights or [1.0] * len(batch.oracle)
        totals: dict[str, list[float]] = {}
        self.model.train()
        stopped = False
        for _ in range(a.update_epochs):
            order = torch.randperm(len(unique_groups), generator=self.generator).tolist()
            for mini_groups in np.array_split([unique_groups[i] for i in order], n_minis):
                chosen = set(mini_groups.tolist())
                idx = [i for i, g in enumerate(groups) if g in chosen]
                oracle_idx = [k for k, g in enumerate(batch.oracle_groups) if g in chosen]
                stats = self._optimizer_step(segments if sampled else [], keys, advantages, old, ref, idx if sampled else [],
                                             (batch.oracle, oracle_keys, oracle_idx, oracle_weights))
                for k, v in stats.items():
                    totals.setdefault(k, []).append(v)
                if stats["skipped"] or stats["nonfinite"]:
                    stopped = True
                    break
            if stopped:
                break
        out = {k: float(np.mean(v)) for k, v in totals.items()}
        # the first mini-batch runs before any of this step's optimizer steps: there, trainer and
        # engine log-probs differ only if the engine samples from other weights (stale, mismatched)
        if sampled:
            out["rollout_logp_abs_diff"] = totals["rollout_logp_abs_diff"][0]
        out["skipped"] = float(stopped and not totals["nonfinite"][-1])
        out["nonfinite"] = totals["nonfinite"][-1]
        out["optimizer_steps"] = self.optimizer_steps
        return out

    def _optimizer_step(self, segments, keys, advantages, old, ref, idx: list[int],
                        oracle: tuple[list[Segment], list[tuple], list[int], list[float]] = ([], [], [], [])
                        ) -> dict[str, float]:
        a = self.algo
        token_total = sum(sum(segments[i].loss_mask[1:]) for i in idx)
        per_token_mode = a.loss_reduction == "token-mean"
        self.optimizer.zero_grad(set_to_none=True)
        acc: dict[str, float] = {}
        # this rank's share of the micro-batches (padding ones, at weight 0, keep FSDP's collectives in step)
        for unique, real in self.ranks.share(_chunks(self._duplicates(idx, keys), a.sequences_per_forward)):
            # one forward row per distinct segment, expanded to one row per copy for the loss
            logp, mask, entropy = self._forward([segments[group[0]] for group in unique], want_entropy=True)
            rows = torch.tensor([row for row, group in enumerate(unique) for _ in group], device=self.device)
            logp, mask, entropy = logp[rows], mask[rows], entropy[rows]
            chunk = [i for group in unique for i in group]
            old_logp = logp.detach() if old is None else _pad([old[i] for i in chunk], logp.shape[1])
            adv = torch.tensor([advantages[i] for i in chunk], dtype=torch.float32, device=self.device)
            loss, stats = self.loss_fn(logp, old_logp, adv, mask, clip_low=a.eps_clip_low,
                                       clip_high=a.eps_clip_high, loss_agg=a.loss_reduction,
                                       max_tokens=a.loss_max_tokens)
            # drift between the engine's sampling log-probs and the trainer's: a stale or mismatched
            # engine shows up here first
            engine_logp = _pad([torch.tensor(segments[i].logprobs[1:]) for i in chunk], logp.shape[1]).to(self.device)
            stats["rollout_logp_abs_diff"] = masked_mean((logp.detach() - engine_logp).abs(), mask)
            # every term is reduced like the policy term (same token budget under Dr. GRPO)
            ent = aggregate(entropy, mask, a.loss_reduction, max_tokens=a.loss_max_tokens)
            total = a.pg_coef * loss - a.entropy_coef * ent
            if ref is not None:
                kl = aggregate(kl_estimate(logp, _pad([ref[i] for i in chunk], logp.shape[1]),
                                           a.kl_estimator_type), mask, a.loss_reduction, max_tokens=a.loss_max_tokens)
                total = total + a.kl_loss_coef * kl
                stats["kl"] = kl.detach()
            # weight this micro-batch by its share of the mini-batch (tokens or sequences)
            weight = float(mask.sum()) / max(token_total, 1) if per_token_mode else len(chunk) / len(idx)
            (total * weight * real * self.ranks.loss_scale).backward()
            if not real:
                continue
            stats.update(loss=loss.detach(), entropy=ent.detach())
            for k, v in stats.items():
                acc[k] = acc.get(k, 0.0) + float(v) * weight
        if oracle[2]:
            acc["oracle_loss"] = self._oracle_backward(*oracle)
        acc = self.ranks.sum_stats(acc)
        grad_norm = self.ranks.full_tensor(torch.nn.utils.clip_grad_norm_(
            self.params, a.max_grad_norm if a.max_grad_norm > 0 else float("inf")))
        acc["nonfinite"] = float(not (math.isfinite(acc.get("loss", 0.0)) and math.isfinite(acc.get("oracle_loss", 0.0))
                                      and math.isfinite(float(grad_norm))))
        # PPO's early stop: the policy already drifted this far from the one that sampled the data
        acc["skipped"] = float(a.target_kl is not None and acc.get("approx_kl", 0.0) > a.target_kl)
        if not (acc["skipped"] or acc["nonfinite"]):
            self.optimizer.step()
            self.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        acc["grad_norm"] = float(grad_norm)
        acc["lr"] = self.optimizer.param_groups[0]["lr"]
        return acc

    def _oracle_backward(self, oracle: list[Segment], keys: list[tuple], idx: list[int],
                         weights: list[float]) -> float:
        """Backward oracle_coef * (the weighted token-mean NLL of the oracle segments `idx`, segment i
        weighing `weights[i]` per token); return this rank's share of that mean (the shares sum to it
        over ranks). Each distinct segment is one forward row, its NLL counted once per copy at that
        copy's weight; every chunk is divided by the mini-batch's weighted token total, so neither the
        micro-batch split nor the rank count changes the result."""
        token_total = sum(weights[i] * sum(oracle[i].loss_mask[1:]) for i in idx)
        share = 0.0
        for unique, real in self.ranks.share(_chunks(self._duplicates(idx, keys), self.algo.sequences_per_forward)):
            logp, mask, _ = self._forward([oracle[group[0]] for group in unique])
            copies = torch.tensor([float(sum(weights[i] for i in group)) for group in unique], device=self.device)
            nll = -((logp * mask).sum(-1) * copies).sum() / (token_total or 1.0)
            (self.algo.oracle_coef * nll * real * self.ranks.loss_scale).backward()
            share += float(nll.detach()) * real
        return share

    # -- weights and checkpoints ----------------------------------------------------------------
    def _gathered(self) -> dict | None:
        """With several ranks, the weights an export holds (the adapter, or the whole model) gathered
        whole; with one, None (save_pretrained reads the model itself)."""
        return self.ranks.full_state(self.model, trainable_only=self.is_peft) if self.ranks.world > 1 else None

    def save_weights(self, sync_root: str | Path, version: int) -> Path:
        """Publish version `version` for the engines (rank 0 writes; every rank takes part in the gather)."""
        state = self._gathered()
        if self.ranks.is_main:
            save_policy_weights(self.model, sync_root, version, state_dict=state)
        self.ranks.barrier()
        return Path(sync_root) / f"v{version}"

    def state_dict(self) -> dict:
        """Everything the update depends on: trainable weights, AdamW, step count (the LR is a
        function of the step, which the driver's checkpoint holds). Keyed by parameter name and
        gathered whole, so a checkpoint from N ranks resumes on M."""
        trainable = self.ranks.full_state(self.model, trainable_only=True)
        return {
            "model": {n: trainable[n] for n in self.names},
            "optimizer": self.ranks.optimizer_state(self.optimizer, self.names),
            "optimizer_steps": self.optimizer_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        params = dict(zip(self.names, self.params))
        if params.keys() != state["model"].keys():
            missing = sorted(params.keys() - state["model"].keys())[:3]
            extra = sorted(state["model"].keys() - params.keys())[:3]
            raise RuntimeError(f"checkpoint weights do not match the model: missing {missing}, unexpected {extra}")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(self.ranks.place_like(state["model"][name], p))
        self.ranks.load_optimizer_state(self.optimizer, self.params, self.names, state["optimizer"])
        self.optimizer_steps = state["optimizer_steps"]

    def export_pretrained(self, url: str, storage_options: dict | None = None) -> None:
        """An inference-ready folder (PEFT adapter or full model, plus processor) at any fsspec URL,
        written whole or not at all (`rlfw.storage.atomic_dir`); by rank 0."""
        import fsspec

        from rlfw.storage import atomic_dir, local_dir_for

        state = self._gathered()
        if self.ranks.is_main:
            fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
            with atomic_dir(fs, path) as staging, local_dir_for(fs, staging) as local:
                self.model.save_pretrained(local, **({"state_dict": state} if state is not None else {}))
                self.processor.save_pretrained(local)
        self.ranks.barrier()


def sequence_logprobs(model: torch.nn.Module, processor: PolicyProcessor, segments: list[Segment],
                      want_entropy: bool = False, temperature: float = 1.0, autocast: str | None = None):
    """Log-probs of each sequence's next tokens under `model`, at the sampling temperature.

    Returns logp [B, T-1], the loss mask shifted to match [B, T-1], and the entropy [B, T-1] or None;
    all three are 0 off the loss mask. Logits are computed only where the loss mask is on (the
    generated tokens: a few per turn), never as a [B, T, V] tensor: with Qwen's ~151k vocabulary
    that tensor would dwarf the model's activations. `autocast` ("bfloat16", model.train_autocast)
    runs the model's forward (and so its backward) under torch.autocast; the log-softmax is float32.
    """
    p = processor
    device = next(model.parameters()).device
    feats = [[p.image_features(img) for img in s.images] for s in segments]
    batch = collate([s.token_ids for s in segments], feats, p.image_token_id, p.pad_token_id, left_pad=False)
    batch = {k: v.to(device) for k, v in batch.items()}
    targets = batch["input_ids"][:, 1:]  # [B, T-1]
    mask = torch.zeros(targets.shape, dtype=torch.float32)  # [B, T-1]
    for i, s in enumerate(segments):
        mask[i, : len(s.token_ids) - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
    mask = mask.to(device)
    keep = torch.cat([mask.bool(), torch.zeros_like(mask[:, :1], dtype=torch.bool)], dim=1)  # [B, T]: predicts a masked token
    with torch.autocast(device.type, dtype=DTYPES[autocast] if autocast else None, enabled=autocast is not None):
        logits = model(**batch, logits_to_keep=keep, use_cache=False, **layer_kwargs(model, keep)).logits  # [N, V]: kept positions
    logits = logits.reshape(-1, logits.shape[-1]).float() / temperature
    on = mask.bool()  # [B, T-1], the same N positions as keep[:, :-1]
    logp = torch.zeros_like(mask)
    logp[on] = torch.log_softmax(logits, -1).gather(-1, targets[on].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if want_entropy:
        entropy = torch.zeros_like(mask)
        entropy[on] = entropy_from_logits(logits)
    return logp, mask, entropy


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Right-pad 1-D tensors with zeros into [len(rows), width], on the device of the first row."""
    out = torch.zeros(len(rows), width, device=rows[0].device if rows else None)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r[:width].to(out.device)
    return out
