"""Small per-file work (counts, checksums, samples) as Ray tasks, so no pass over the data runs in the caller.

The stages stream documents through the engine's shard pipelines; around them, the assets need facts
about whole slices: rows and kept rows, documents per language, line counts and checksums of raw shards,
the oracle's sample, the prefilter's fit sample. `map_tasks` runs a function over a list of items (file
paths, shard descriptions) as Ray tasks and returns its small results in the items' order: the Dagster
process holds results, never rows. Without a Ray connection in this process (a notebook, a unit test) the
same function runs here, item by item, with the same results.

Items are grouped into at most `TASKS_PER_CPU` tasks per CPU of the cluster, so a slice of 10^4 files costs
a few hundred task launches, not 10^4. `iter_tasks` is the streaming form, for results that are small one
at a time but not all together (a file's training text for the tokenizer): a task per item, a bounded
number in flight, results yielded in the items' order.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

TASKS_PER_CPU = 4
_REMOTE: dict[str, Any] = {}


def map_tasks(
    fn: Callable[[Item], Result],
    items: Sequence[Item],
    *,
    workers: int | None = None,
    this_node: bool = False,
    threads: bool = False,
) -> list[Result]:
    """`[fn(item) for item in items]`, as Ray tasks when this process is connected to Ray.

    `fn` must be importable by the workers (a module-level function, or a `functools.partial` of one).
    `workers`: 0 runs here even when Ray is connected (as the engine's `workers: 0`); otherwise the tasks
    spread over the whole cluster, or only over this process's machine with `this_node` (work that writes
    a file this process will hand on, such as the packed rows of a mixture in its artefact folder).
    `threads`: what runs here runs on a thread per core (for work that releases the GIL, numpy copies)."""
    if not items:
        return []
    if workers == 0 or not _ray_connected():
        if threads and len(items) > 1:
            with ThreadPoolExecutor(max_workers=min(len(items), os.cpu_count() or 1)) as pool:
                return list(pool.map(fn, items))
        return [fn(item) for item in items]
    import ray

    from moe_dag.engine.cluster import cluster_cpus

    remote = _remote(this_node)
    cpus = workers or (int(ray.available_resources().get("CPU", 1)) if this_node else cluster_cpus())
    groups = min(len(items), max(1, cpus) * TASKS_PER_CPU)
    bounds = [len(items) * g // groups for g in range(groups + 1)]
    shipped = _shipped(fn)
    handles = [
        remote.remote(shipped, list(items[start:end])) for start, end in zip(bounds, bounds[1:], strict=False)
    ]
    return [result for group in ray.get(handles) for result in group]


def iter_tasks(
    fn: Callable[[Item], Result], items: Sequence[Item], *, in_flight: int = 4
) -> Iterator[Result]:
    """`fn(item)` for each item, yielded in order: a Ray task per item with at most `in_flight` running
    (so at most that many results wait here), or lazily here without a Ray connection."""
    if not _ray_connected():
        yield from map(fn, items)
        return
    remote, shipped = _remote(this_node=False), _shipped(fn)
    pending: collections.deque = collections.deque()
    for item in items:
        pending.append(remote.remote(shipped, [item]))
        if len(pending) >= in_flight:
            yield from _ray_get(pending.popleft())
    while pending:
        yield from _ray_get(pending.popleft())


def _remote(this_node: bool):  # noqa: ANN202 (a Ray remote function)
    import ray

    if "run_group" not in _REMOTE:  # exported to the workers once per process
        _REMOTE["run_group"] = ray.remote(num_cpus=1)(_run_group)
    if not this_node:
        return _REMOTE["run_group"]
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return _REMOTE["run_group"].options(scheduling_strategy=here)


def _shipped(fn: Callable) -> Any:
    """`fn` put into Ray's object store once, for every task to take (Ray hands a task the value of an
    object reference passed as an argument). Passed as it is, `fn` would be pickled into the store again
    for each task: a partial can carry a model (the perplexity filter's, 5-13 MB on the demo corpus), and
    each copy also stays in this process's resident shared pages (the prefilter's fit grew the driver's
    RSS by 116 MiB at 4x the demo corpus, eight copies of two sources' models, against 54 MiB at 1x)."""
    import ray

    return ray.put(fn)


def _ray_get(handle: Any) -> list:
    import ray

    return ray.get(handle)


def _run_group(fn: Callable[[Item], Result], items: list[Item]) -> list[Result]:
    return [fn(item) for item in items]


def _ray_connected() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()
