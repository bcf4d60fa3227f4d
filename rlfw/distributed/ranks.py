"""Training ranks: the trainer group's process group, FSDP2 sharding, and the few collectives the
policy update needs. `PolicyTrainer` holds a `Ranks` and never branches on the world size.

With one rank (`Ranks()`) nothing here touches `torch.distributed`: every collective is the
identity. With N ranks (`Ranks.join`) the N trainer processes form one process group (gloo on CPU,
nccl on CUDA), the policy is sharded with `fully_shard` per transformer block (decoder layers and
vision blocks) and at the root, after LoRA is applied. Every rank weights its share of a mini-batch
by the whole mini-batch's token (or sequence) total, so the sum of the ranks' gradients is exactly
the one-rank gradient (FSDP averages, hence `loss_scale`).

FSDP2 runs collectives inside every forward and backward, so all ranks must make the same calls in
the same order: a rank with fewer micro-batches than another runs padding micro-batches (a real one
at weight 0, `share`). Every segment must take the same path through the model (all maze turns
carry an image; an env mixing image and text-only turns would need padding by kind).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

import torch

from rlfw.config import FSDPConfig


@dataclass
class Rendezvous:
    """Where rank 0 listens, and this process's rank in a group of `world`."""

    address: str
    port: int
    rank: int
    world: int


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one (transformers marks them GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


class Ranks:
    """This process's place in the trainer group (rank 0 of 1 unless joined)."""

    def __init__(self, rank: int = 0, world: int = 1, device: str = "cpu"):
        self.rank, self.world, self.device = rank, world, device

    @classmethod
    def join(cls, rv: Rendezvous, device: str, timeout_s: float = 600.0) -> "Ranks":
        """Join the process group (blocks until all `rv.world` ranks have joined)."""
        import torch.distributed as dist

        if rv.world == 1:
            return cls(0, 1, device)
        if device.startswith("cuda"):
            torch.cuda.set_device(0)  # Ray gives each rank its own CUDA_VISIBLE_DEVICES
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                init_method=f"tcp://{rv.address}:{rv.port}", rank=rv.rank, world_size=rv.world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rv.rank, rv.world, device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- sharding -------------------------------------------------------------------------------
    def shard(self, model: torch.nn.Module, opts: FSDPConfig) -> torch.nn.Module:
        """FSDP2 over all ranks (a no-op with one rank); call after LoRA is applied, before the optimizer."""
        if opts.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.world == 1:
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        cuda = self.device.startswith("cuda")
        mesh = init_device_mesh("cuda" if cuda else "cpu", (self.world,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if cuda and opts.mixed_precision:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cuda and opts.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        for block in _blocks(model):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model

    @property
    def loss_scale(self) -> float:
        """FSDP averages gradients over ranks; each rank's loss is weighted by the whole mini-batch's
        totals, so scaling it by the world size makes the average the one-rank gradient (gloo has no
        pre-multiplied sum to set a divide factor of 1 instead)."""
        return float(self.world)

    # -- work sharing ---------------------------------------------------------------------------
    def share(self, items: list) -> list[tuple[Any, bool]]:
        """This rank's items of `items` (every world-th), as (item, real); padded with (items[0], False)
        so that every rank makes the same number of forward and backward calls."""
        mine = [(x, True) for x in items[self.rank::self.world]]
        count = math.ceil(len(items) / self.world)
        return mine + [(items[0], False)] * (count - len(mine)) if items else []

    # -- collectives ----------------------------------------------------------------------------
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (small Python objects)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Per-key sums over ranks (a rank that had no real micro-batch contributes nothing)."""
        total: dict[str, float] = {}
        for part in self.gather(stats):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A sharded tensor (DTensor) gathered whole on every rank; plain tensors as they are."""
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    def full_state(self, model: torch.nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
        """The model's state dict (or only its trainable entries) gathered whole, on CPU, on every
        rank. Gathering only what trains keeps an adapter's gather small: the frozen base stays sharded."""
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        # a tied weight (the LM head) is saved once, under its first name, as save_pretrained does
        tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
        return {n: self.full_tensor(t.detach()).cpu().clone() for n, t in model.state_dict().items()
                if n not in tied and (not trainable_only or n in trainable)}

    def optimizer_state(self, optimizer: torch.optim.Optimizer, names: list[str]) -> dict:
        """The optimizer's state keyed by parameter name and gathered whole: the same checkpoint from
        any number of ranks (`names[i]` is the name of the optimizer's i-th parameter)."""
        sd = optimizer.state_dict()
        state = {names[i]: {k: self.full_tensor(v).cpu().clone() if torch.is_tensor(v) else v for k, v in st.items()}
                 for i, st in sd["state"].items()}
        groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
        return {"state": state, "param_groups": groups}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                             names: list[str], saved: dict) -> None:
        """Inverse of `optimizer_state`, sharding each per-parameter tensor like its parameter."""
        if saved["param_groups"] and saved["param_groups"][0]["params"] and \
                isinstance(saved["param_groups"][0]["params"][0], int):  # written by one rank before names
            optimizer.load_state_dict(saved)
            return
        index = {n: i for i, n in enumerate(names)}
        state = {}
        for name, st in saved["state"].items():
            p = params[index[name]]
            state[index[name]] = {k: self.place_like(v, p) for k, v in st.items()}
        groups = [{**g, "params": [index[n] for n in g["params"]]} for g in saved["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})

    @staticmethod
    def place_like(v: Any, p: torch.Tensor) -> Any:
        """A saved whole tensor placed like parameter p (sharded when p is a DTensor)."""
        if not torch.is_tensor(v) or v.shape != p.shape:
            return v  # e.g. AdamW's scalar step
        if hasattr(p, "device_mesh"):
            from torch.distributed.tensor import distribute_tensor

            return distribute_tensor(v.to(p.device_mesh.device_type), p.device_mesh, p.placements)
        return v.to(p.device)

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port, for rank 0 to listen on (run on rank 0's node)."""
    import socket

    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:  # not under Ray
        ip = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        return ip, s.getsockname()[1]
