"""Ray placement: one placement group sized from the config, the trainer and engines as actors.

With `cluster.colocate_all=true` trainer rank i shares bundle i with engine i (on GPUs the engines
sleep while the trainer updates); otherwise every worker gets its own bundle. Several trainer ranks
(`cluster.trainer_ranks`) form one torch.distributed group behind `TrainerGroup`. A placement
group that cannot be placed fails after `cluster.placement_timeout_s` with the resources it asked
for and what the cluster has, instead of hanging. A busy `cluster.metrics_export_port` is reported
and replaced by a free one, since Ray would not start with it.
"""

from __future__ import annotations

import logging
import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlfw.config import Config
from rlfw.distributed.ranks import Rendezvous
from rlfw.distributed.workers import EnginePool, EngineWorker, PolicyWorker
from rlfw.rollout.engine import EngineFailure


class PlacementError(RuntimeError):
    pass


class TrainerFailure(RuntimeError):
    """The trainer worker died; `rlfw.run` replaces the runtime and resumes from the latest checkpoint."""


class _Proxy:
    """Synchronous method calls on the trainer actor: proxy.update(x) == ray.get(actor.update.remote(x))."""

    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, name):
        method = getattr(self.actor, name)

        def call(*args, **kwargs):
            try:
                return ray.get(method.remote(*args, **kwargs))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                raise TrainerFailure(f"the trainer worker died during {name}() ({type(exc).__name__})") from exc

        return call


class TrainerGroup:
    """The trainer ranks behind the one-trainer interface: every call runs on all ranks at once (they
    meet in collectives) and returns rank 0's result. If any rank dies, the call fails at once with
    TrainerFailure instead of waiting on the others, which would block in a collective."""

    def __init__(self, actors: list):
        self.actors = actors

    def __getattr__(self, name):
        def call(*args, **kwargs):
            refs = [getattr(a, name).remote(*args, **kwargs) for a in self.actors]
            pending = list(refs)
            try:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=1)
                    ray.get(ready)  # raises as soon as any rank fails
                return ray.get(refs[0])
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                raise TrainerFailure(f"a trainer rank died during {name}() ({type(exc).__name__})") from exc

        return call


@ray.remote(num_cpus=0)
def _rank0_address() -> tuple[str, int]:
    from rlfw.distributed.ranks import free_address

    return free_address()


def _ray_call(calls):
    try:
        return ray.get([getattr(actor, method).remote(*args) for actor, method, args in calls])
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
        raise EngineFailure(f"a rollout engine died ({type(exc).__name__}); Ray is restarting it") from exc


def bundles_for(cfg: Config) -> list[dict[str, float]]:
    c = cfg.cluster
    bundle = {"CPU": float(c.cpus_per_worker)}
    if c.gpus_per_worker > 0:
        bundle["GPU"] = float(c.gpus_per_worker)
    n = max(c.num_engines, c.trainer_ranks) if c.colocate_all else c.num_engines + c.trainer_ranks
    return [dict(bundle) for _ in range(n)]


class ClusterUnreachable(RuntimeError):
    pass


def connect(address: str, timeout_s: float = 5.0) -> None:
    """Join the Ray cluster at `address` (host:port of its GCS, `auto`, or `ray://host:port`), or fail
    within seconds saying which address was tried (Ray itself retries for minutes)."""
    import socket

    tried = os.environ.get("RAY_ADDRESS") or address  # Ray lets RAY_ADDRESS override the argument
    note = f" (from RAY_ADDRESS, which overrides cluster.ray_address={address})" if tried != address else ""
    if tried != "auto":
        host, _, port = tried.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except (OSError, ValueError) as exc:
            raise ClusterUnreachable(f"no Ray cluster answers at {tried}{note}: {exc}. Start one (`ray start "
                                     "--head`), fix cluster.ray_address, or leave it unset to start Ray here") from exc
    try:
        ray.init(address=tried, log_to_driver=True, configure_logging=False)
    except ConnectionError as exc:
        raise ClusterUnreachable(f"could not join the Ray cluster at {tried}{note}: {exc}") from exc


def metrics_export_port(port: int | None) -> tuple[int | None, str]:
    """The metrics export port to start Ray with: `port` if it can be bound, else None (Ray picks a free
    one) and why not. Ray 2.60 does not survive a busy one: its metrics agent dies and the node times out
    during startup, so it is checked here, binding as Ray's exporter does (all interfaces, SO_REUSEADDR)."""
    import socket

    if port is None:
        return None, ""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except (OSError, OverflowError) as exc:  # in use, not allowed, or not a port number
            return None, str(exc)
    return port, ""


def served_metrics_port() -> int | None:
    """The metrics export port of this driver's Ray node."""
    node = ray.get_runtime_context().get_node_id()
    return next((n["MetricsExportPort"] for n in ray.nodes() if n["NodeID"] == node), None)


class RayRuntime:
    def __init__(self, cfg: Config, model_path: str):
        c = cfg.cluster
        if not ray.is_initialized():
            os.environ.setdefault("RAY_DEDUP_LOGS", "0")
            if c.ray_address:
                connect(c.ray_address)
            else:
                port, busy = metrics_export_port(c.metrics_export_port)
                ray.init(include_dashboard=False, log_to_driver=True, configure_logging=False, num_cpus=os.cpu_count(),
                         _metrics_export_port=port)
                if busy:
                    logging.getLogger("rlfw").warning(
                        "cluster.metrics_export_port=%s cannot be used (%s); Ray serves its metrics, rlfw_* gauges "
                        "included, on port %s instead (point Prometheus there, or free the port)",
                        c.metrics_export_port, busy, served_metrics_port())
        bundles = bundles_for(cfg)
        self.pg = placement_group(bundles, strategy="PACK")
        if not self.pg.wait(timeout_seconds=c.placement_timeout_s):
            remove_placement_group(self.pg)
            raise PlacementError(
                f"could not place {len(bundles)} bundles of {bundles[0]} within {c.placement_timeout_s}s; the "
                f"cluster has {ray.available_resources()}. Lower cluster.num_engines or cluster.cpus_per_worker/"
                "gpus_per_worker, or set cluster.colocate_all=true."
            )
        share = 2 if c.colocate_all else 1  # colocated workers split their bundle

        def opts(index: int):
            return dict(
                num_cpus=c.cpus_per_worker / share,
                num_gpus=c.gpus_per_worker / share,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=index),
            )

        n = c.trainer_ranks
        address, port = ray.get(_rank0_address.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.pg, placement_group_bundle_index=0)).remote()) if n > 1 else ("", 0)
        self.policy_actors = [
            ray.remote(PolicyWorker).options(**opts(r)).remote(
                cfg.model, cfg.algo, model_path, cfg.trainer.total_steps, cfg.seed, c.torch_threads, c.gpus_per_worker,
                Rendezvous(address, port, r, n) if n > 1 else None, c.fsdp)
            for r in range(n)
        ]
        first = 0 if c.colocate_all else n
        self.engine_actors = [
            ray.remote(EngineWorker).options(max_restarts=c.max_engine_restarts, **opts(first + i)).remote(
                cfg.model, model_path, c.torch_threads, c)
            for i in range(c.num_engines)
        ]
        self.policy = _Proxy(self.policy_actors[0]) if n == 1 else TrainerGroup(self.policy_actors)
        self.engine = EnginePool(self.engine_actors, _ray_call)

    def shutdown(self) -> None:
        for actor in [*self.policy_actors, *self.engine_actors]:
            ray.kill(actor)
        remove_placement_group(self.pg)
