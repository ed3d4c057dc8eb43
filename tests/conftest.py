"""Shared fixtures: one local Ray for the whole test session (starting Ray costs seconds)."""

import pytest


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray with two CPUs and a small object store, started once and stopped at the end."""
    import ray

    from moe_dag.data.engine import RayConfig, connect

    connect(RayConfig(num_cpus=2, object_store_gb=0.25))
    yield
    ray.shutdown()
