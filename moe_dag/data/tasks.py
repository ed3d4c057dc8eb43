"""Small per-file work (counts, checksums, samples) as Ray tasks, so no pass over the data runs in the caller.

The stages stream documents through the engine's shard pipelines; around them, the assets need facts
about whole slices: rows and kept rows, documents per language, line counts and checksums of raw shards,
the oracle's sample, the prefilter's fit sample. `map_tasks` runs a function over a list of items (file
paths, shard descriptions) as Ray tasks and returns its small results in the items' order: the Dagster
process holds results, never rows. Without a Ray connection in this process (a notebook, a unit test) the
same function runs here, item by item, with the same results.

Items are grouped into at most `TASKS_PER_CPU` tasks per CPU of the cluster, so a slice of 10^4 files costs
a few hundred task launches, not 10^4.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

TASKS_PER_CPU = 4
_REMOTE: dict[str, Any] = {}


def map_tasks(
    fn: Callable[[Item], Result], items: Sequence[Item], *, workers: int | None = None
) -> list[Result]:
    """`[fn(item) for item in items]`, as Ray tasks when this process is connected to Ray.

    `fn` must be importable by the workers (a module-level function, or a `functools.partial` of one).
    `workers`: 0 runs here even when Ray is connected (as the engine's `workers: 0`); otherwise the tasks
    spread over the whole cluster."""
    if not items:
        return []
    if workers == 0 or not _ray_connected():
        return [fn(item) for item in items]
    import ray

    from moe_dag.data.engine.cluster import cluster_cpus

    if "run_group" not in _REMOTE:  # exported to the workers once per process
        _REMOTE["run_group"] = ray.remote(num_cpus=1)(_run_group)
    groups = min(len(items), (workers or cluster_cpus()) * TASKS_PER_CPU)
    bounds = [len(items) * g // groups for g in range(groups + 1)]
    handles = [
        _REMOTE["run_group"].remote(fn, list(items[start:end]))
        for start, end in zip(bounds, bounds[1:], strict=False)
    ]
    return [result for group in ray.get(handles) for result in group]


def _run_group(fn: Callable[[Item], Result], items: list[Item]) -> list[Result]:
    return [fn(item) for item in items]


def _ray_connected() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()
