"""Test-wide settings and shared fixtures."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.local_processes import free_port
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


@dataclass(frozen=True)
class S3Server:
    """moto's S3 server in a process of its own, so a test can stall it (SIGSTOP) or switch its
    checking of credentials on (`require_credentials`)."""

    endpoint: str
    process: subprocess.Popen

    def require_credentials(self, required: bool) -> None:
        """With `required`, every request must be signed by a key moto's IAM knows (none is: every
        request is refused as an unknown key would be); else any key is accepted."""
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=b"0" if required else b"inf",  # requests served before checking starts
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """A real S3 server (moto's) on a free port of this machine, one per test module."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = S3Server(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 120  # a loaded machine starts it in seconds
    while True:
        try:
            urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=5).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto's S3 server did not start ({' '.join(command)})") from None
            time.sleep(0.2)
    yield server
    os.kill(process.pid, signal.SIGCONT)  # a test that stalled it and failed must not leave it stopped
    process.kill()
    process.wait()
