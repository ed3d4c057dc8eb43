"""Test-wide settings and shared fixtures."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.pipeline_configs import demo_config

# The tests run many small tensor ops. On a shared 2-core machine torch's intra-op threads wait on
# each other more than they help: the MoE balancing test took 34 s with 2 threads and 2 s with 1.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (in their usual order, then the others): with pytest-xdist's workers
    (`make test`) a test of minutes that starts last would leave the other worker idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray with two CPUs and a small object store, started once and stopped at the end."""
    import ray

    from moe_dag.engine import RayConfig, connect

    connect(RayConfig(num_cpus=2, object_store_gb=0.25))
    yield
    ray.shutdown()


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., Path]:
    """`make_config(changes, name)`: configs/demo.yaml with its lake and catalog in tmp_path and `changes`
    applied (see tests/pipeline_configs.py), written to tmp_path/name ("pipeline.yaml" unless named)."""

    def make(changes: dict | None = None, name: str = "pipeline.yaml") -> Path:
        return demo_config(tmp_path, changes, name)

    return make
