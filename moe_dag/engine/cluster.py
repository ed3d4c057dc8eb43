"""Connecting to Ray: an existing cluster by address, or a local Ray sized to this machine.

Local by default. With an address (`ray.address` in the pipeline config, or `RAY_ADDRESS`), the same
stages run on an existing cluster, whose nodes must run the same environment (this package and its
dependencies installed, the lake reachable at the same path or URL).

The local Ray takes every core but caps its object store: Ray's default is 30% of memory in shared
memory, which next to Dagster and the stages' own memory is more than a 24 GiB machine can spare. The
stages pass shard names and small records through the object store, never documents (each worker
streams its shard from the lake and writes its outputs there), so a small store is enough.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30
MIN_OBJECT_STORE_BYTES = GIB // 4
MAX_OBJECT_STORE_BYTES = 4 * GIB
DEFAULT_MIN_BLOCK_ROWS = 8_192  # 4 read batches
# A task takes one CPU, and Ray caps OpenMP (torch, numpy) at the task's CPUs for that reason, but not
# rayon: Hugging Face tokenizers' `encode_batch` in a one-CPU task started a pool of every core's threads,
# so two tasks ran six threads on two cores, and a second worker gained nothing in tokenising.
# Ray hands a task's return value under `max_direct_call_object_size` (100 KB by default) straight to the
# caller, who keeps it in its own memory until the reference goes: the driver of a shuffle, which owns
# parts x parts such shares (dedup's partitioned clustering), held every small one. Above this size a
# return goes to the object store, which spills. At 16x the scale benchmark's dedup_clusters grew the
# driver by 44 MiB with the default and 7 MiB with 1 KB (docs/scale.md).
INLINE_RETURN_BYTES = 1024
WORKER_ENV = {"RAYON_NUM_THREADS": "1", "RAY_max_direct_call_object_size": str(INLINE_RETURN_BYTES)}
AUTH_MODE_ENV_VAR = "RAY_AUTH_MODE"  # ray._private.authentication's switch: token or disabled


@dataclass(kw_only=True)
class RayConfig:
    address: str | None = None  # a Ray cluster ("ray://host:10001", "host:6379"); None: RAY_ADDRESS or local
    num_cpus: int | None = None  # local Ray only; None: every core of this machine
    object_store_gb: float | None = None  # local Ray only; None: 10% of memory, within [0.25, 4] GiB
    workers: int | None = None  # shards processed at once per stage; None: every CPU of the cluster
    # A stage with fewer shards to do than workers splits its shards into blocks of at least this many
    # rows (whole read batches) for the idle workers, so one large shard keeps several busy; None: never.
    min_block_rows: int | None = DEFAULT_MIN_BLOCK_ROWS
    scoring_gpus: float = 0.0  # GPUs per scoring actor (1 on a GPU cluster)

    def __post_init__(self) -> None:
        for name in ("num_cpus", "workers", "min_block_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"ray.{name} must be a positive integer, got {value!r}")
        if self.object_store_gb is not None and self.object_store_gb * GIB < MIN_OBJECT_STORE_BYTES:
            raise ValueError(f"ray.object_store_gb must be at least 0.25, got {self.object_store_gb}")
        if self.scoring_gpus < 0:
            raise ValueError(f"ray.scoring_gpus must be >= 0, got {self.scoring_gpus}")

    def resolved_address(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None


def local_object_store_bytes(config: RayConfig) -> int:
    if config.object_store_gb is not None:
        return int(config.object_store_gb * GIB)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(memory // 10, MIN_OBJECT_STORE_BYTES), MAX_OBJECT_STORE_BYTES))


def connect(config: RayConfig) -> str:
    """Connect this process to Ray once (later calls reuse the connection); returns where it runs."""
    import ray

    if not ray.is_initialized():
        address = config.resolved_address()
        # fsspec's settings by environment (`FSSPEC_*`, among them the object-store timeouts a pipeline
        # config sets: storage/object_store.py) go with the workers, so a cluster's nodes reach the
        # stores as this process does.
        fsspec_env = {name: value for name, value in os.environ.items() if name.startswith("FSSPEC_")}
        runtime_env = {"env_vars": {**WORKER_ENV, **fsspec_env}}
        if address:
            ray.init(address=address, runtime_env=runtime_env)
        else:
            _choose_token_auth()
            # "local" starts a new instance even if a `ray start` cluster runs on this machine. Its
            # workers' own log lines (actor pools winding down, ...) stay in Ray's session logs: a
            # failed shard reaches the caller as an error naming its file, not as console noise.
            ray.init(
                address="local",
                num_cpus=config.num_cpus or os.cpu_count(),
                object_store_memory=local_object_store_bytes(config),
                include_dashboard=False,
                log_to_driver=False,
                runtime_env=runtime_env,
            )
    resources = ray.cluster_resources()
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    return f"Ray at {ray.get_runtime_context().gcs_address}: {cpus} CPUs, {gpus} GPUs"


def _choose_token_auth() -> None:
    """Token authentication for a new local Ray, chosen here rather than by Ray's default: when
    RAY_AUTH_MODE is unset Ray turns it on itself and warns on every start that it did, which tells the
    user of a local Ray nothing to do. A RAY_AUTH_MODE the user set stands."""
    if AUTH_MODE_ENV_VAR in os.environ:
        return
    os.environ[AUTH_MODE_ENV_VAR] = "token"
    # Ray's config read the variable when ray was imported: read it again, as Ray does when it turns
    # token authentication on itself (ray._private.authentication.authentication_token_setup).
    from ray._raylet import Config

    Config.initialize("")


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))
