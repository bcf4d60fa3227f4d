"""The two kinds of worker: the policy trainer and a rollout engine.

Each builds its own copy of the model from the same checkpoint path (and the same LoRA config),
so they can live in separate processes; afterwards only adapters travel, through shared storage.
The same classes run in-process (tests, debugging) or as Ray actors (`rlfw.distributed.ray_runtime`).
"""

from __future__ import annotations

import logging
import time

import torch

from rlfw.config import AlgoConfig, ClusterConfig, FSDPConfig, ModelConfig
from rlfw.distributed.ranks import Ranks, Rendezvous
from rlfw.rollout.engine import EngineFailure
from rlfw.rollout.types import Completion, Prompt, SamplingParams, Segment, TrainBatch


log = logging.getLogger("rlfw")


def _threads(n: int) -> None:
    torch.set_num_threads(n)


def worker_device(gpus_per_worker: float) -> str:
    """cuda when the worker was given a GPU (Ray sets CUDA_VISIBLE_DEVICES to it), else cpu."""
    if gpus_per_worker <= 0:
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(f"cluster.gpus_per_worker={gpus_per_worker}, but this worker sees no CUDA device "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}); "
                           "install a CUDA torch or set cluster.gpus_per_worker=0")
    return "cuda"


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PolicyWorker:
    """One training rank: the policy, its optimizer and, with `rendezvous` for a group of several,
    its shard (`rlfw.distributed.ranks`). Every rank builds the same model from the same seed."""

    def __init__(self, model_cfg: ModelConfig, algo: AlgoConfig, path: str, total_steps: int,
                 seed: int, torch_threads: int, gpus: float = 0.0, rendezvous: Rendezvous | None = None,
                 fsdp: FSDPConfig | None = None):
        from rlfw.algos import import_algo_module
        from rlfw.build import build_policy_model, seed_everything
        from rlfw.models import resolve_train_autocast
        from rlfw.policy import PolicyTrainer

        _threads(torch_threads)
        import_algo_module(algo.module)  # the user's registered loss must exist in this process too
        self.model_cfg, self.path = model_cfg, path
        device = worker_device(gpus)
        fsdp = fsdp or FSDPConfig()
        ranks = Ranks.join(rendezvous, device, fsdp.timeout_s) if rendezvous else Ranks(device=device)
        seed_everything(seed)
        model, processor = build_policy_model(model_cfg, path)
        autocast = resolve_train_autocast(model_cfg.train_autocast, device)
        if model_cfg.train_autocast == "auto":
            logging.getLogger(__name__).info("model.train_autocast=auto on %s: %s", device, autocast or "float32")
        self.trainer = PolicyTrainer(model, processor, algo, total_steps, seed=seed, device=device,
                                     ranks=ranks, fsdp=fsdp, autocast=autocast,
                                     compile=model_cfg.compile)

    def update(self, batch: TrainBatch, step: int, seed: int = 0, lr_progress: float | None = None) -> dict[str, float]:
        return self.trainer.update(batch, step, seed, lr_progress)

    def save_checkpoint(self, url: str, storage_options: dict) -> dict | None:
        """Write the trainer state to `url` (any fsspec URL); return its manifest entry (rank 0 writes
        the gathered state; the other ranks take part in the gather and return None)."""
        from rlfw.storage import save_state

        state = self.trainer.state_dict()
        return save_state(url, state, storage_options) if self.trainer.ranks.is_main else None

    def load_checkpoint(self, url: str, storage_options: dict) -> None:
        from rlfw.storage import load_state

        self.trainer.load_state_dict(load_state(url, storage_options))

    def export_pretrained(self, url: str, storage_options: dict) -> None:
        self.trainer.export_pretrained(url, storage_options)

    def save_weights(self, sync_root: str, version: int) -> str:
        return str(self.trainer.save_weights(sync_root, version))

    def logprobs(self, segments: list[Segment]) -> list[list[float]]:
        return [lp.tolist() for lp in self.trainer.logprobs(segments)]

    def peak_rss_mb(self) -> float:
        return peak_rss_mb()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return self.trainer.ranks.full_state(self.trainer.model, trainable_only=True)


class EngineWorker:
    """A rollout engine in its own process: the backend `cluster.engine_backend` names (see
    `rlfw.rollout.backends`), behind the `InferenceEngine` protocol."""

    def __init__(self, model_cfg: ModelConfig, path: str, torch_threads: int, cluster: ClusterConfig | None = None):
        from rlfw.rollout.backends import build_engine

        _threads(torch_threads)
        cluster = cluster or ClusterConfig(name="local")
        self.engine = build_engine(cluster.engine_backend, model_cfg, path, cluster, worker_device(cluster.gpus_per_worker))

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        return self.engine.generate(prompts, params)

    def load_weights(self, path: str) -> int:
        return self.engine.load_weights(path)

    def set_seed(self, seed: int) -> None:
        """Seed the sampler; a step's rollouts are then a function of (seed, weights)."""
        self.engine.set_seed(seed)

    def peak_rss_mb(self) -> float:
        return peak_rss_mb()

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()


class EnginePool:
    """Several engines behind the single-engine interface: a batch is split evenly across them.

    If an engine dies (the runtime raises EngineFailure and restarts it), idempotent calls wait
    for it, reload the latest published weights and retry; `generate` lets the failure reach the
    training loop, which redoes that step's rollouts after `recover`.
    """

    def __init__(self, engines: list, call, retries: int = 10, wait_s: float = 1.0):
        self.engines = engines
        self._call = call  # call(list_of_(engine, method, args)) -> list of results, run concurrently
        self.retries, self.wait_s = retries, wait_s
        self.sync_root: str | None = None

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Completion]:
        n = len(self.engines)
        size = -(-len(prompts) // n)
        parts = [(e, "generate", (prompts[i * size:(i + 1) * size], params)) for i, e in enumerate(self.engines)]
        parts = [p for p in parts if p[2][0]]
        return [c for chunk in self._call(parts) for c in chunk]

    def _call_each(self, method: str, args: list[tuple], reload: bool = True) -> list:
        """engines[i].method(*args[i]) on every engine, waiting out a restart (idempotent calls only)."""
        for attempt in range(self.retries + 1):
            try:
                return self._call([(e, method, a) for e, a in zip(self.engines, args)])
            except EngineFailure as exc:
                if attempt == self.retries:
                    raise
                log.warning("%s; waiting for the restart, then reloading the latest weights", exc)
                time.sleep(self.wait_s)
                if reload and self.sync_root is not None:
                    self.recover(self.sync_root)
        raise AssertionError("unreachable")

    def load_weights(self, path: str) -> list[int]:
        self.sync_root = path
        return self._call_each("load_weights", [(path,)] * len(self.engines), reload=False)

    def recover(self, sync_root: str) -> None:
        """After an EngineFailure: wait for the restarted engines and load the latest weights."""
        self.load_weights(sync_root)

    def set_seed(self, seed: int) -> None:
        """Every engine gets the same seed: requests draw from (seed, their sample_key), so which
        engine serves a request does not change its sample, and N engines give the episodes of one."""
        self._call_each("set_seed", [(seed,)] * len(self.engines))

    def peak_rss_mb(self) -> list[float]:
        return self._call_each("peak_rss_mb", [()] * len(self.engines))

    def sleep(self) -> None:
        self._call_each("sleep", [()] * len(self.engines))

    def wake_up(self) -> None:
        self._call_each("wake_up", [()] * len(self.engines))
