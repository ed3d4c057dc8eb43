"""A local Ray starts without Ray's token-authentication warning on every run (issue 34, item 7).

Ray 2.60 turns token authentication on for a new local cluster when RAY_AUTH_MODE is unset, and warns
that it did, on every `ray.init`: for the local Ray the pipeline starts itself the warning tells the user
nothing to do. `connect` names token mode, as Ray would choose it, so Ray has nothing to warn about; a
cluster by address keeps whatever mode its operator set.
"""

from __future__ import annotations

import os
import subprocess
import sys

CONNECT_LOCALLY = (
    "from moe_dag.engine.cluster import RayConfig, connect; "
    "import ray, os; connect(RayConfig(num_cpus=1, object_store_gb=0.25)); "
    "print('mode', os.environ['RAY_AUTH_MODE']); ray.shutdown()"
)


def test_a_local_ray_starts_with_token_auth_and_without_its_warning():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    started = subprocess.run(
        [sys.executable, "-c", CONNECT_LOCALLY], env=env, capture_output=True, text=True, timeout=300
    )
    assert started.returncode == 0, started.stderr
    assert "mode token" in started.stdout
    assert "Token authentication" not in started.stdout + started.stderr
