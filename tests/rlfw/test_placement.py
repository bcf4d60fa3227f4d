"""A placement group that cannot be placed fails fast with a message, instead of hanging."""

import pytest

from rlfw.config import ClusterConfig, Config, ModelConfig


def test_unplaceable_cluster_fails_with_message():
    ray = pytest.importorskip("ray")
    from rlfw.distributed.ray_runtime import PlacementError, RayRuntime

    cfg = Config(cluster=ClusterConfig(name="x", num_engines=64, cpus_per_worker=4, placement_timeout_s=2),
                 model=ModelConfig(name="tiny_vl"))
    try:
        with pytest.raises(PlacementError, match="Lower cluster.num_engines"):
            RayRuntime(cfg, model_path="unused")
    finally:
        ray.shutdown()
