"""Run a per-source stage over the shards that need it: on Ray by default, or in this process.

Each shard is one Ray task (at most as many at once as there are workers). The task streams its shard
from the lake in Arrow batches through the stage's library function and writes the outputs back
(`process_shard`), so documents never pass through the object store or the driver, and memory grows
with the batch size, not with the source. The shard is the unit of work and of commit, as in
datatrove: a source of many shards keeps every core busy.

Tasks run in Ray's worker processes, which live as long as this process's Ray connection and serve
every stage and source: work that holds a model (`StageSpec.warm`) is built once per process and kept
for later shards and stage runs (warm.py), so a stage run starts no pipeline and spawns no process.
(It used to be a Ray Data pipeline per stage run, with a fresh actor pool for model work: on a new
shard, those starts and the model loads were most of each stage's seconds; docs/incremental.md.)
GPU work runs in actors of its own, for the one stage run.

The driver sees each shard as it finishes: it counts documents and documents per second for the
progress bar (on a terminal) and the log (every few seconds, e.g. the Dagster run log), collects the
shards that failed, and raises once the others are done, naming each failed shard's file.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from tqdm.auto import tqdm

from moe_dag.engine.blocks import (
    MIN_BLOCK_BYTES,
    BlockSizes,
    clean_blocks,
    finished_blocks,
)
from moe_dag.engine.cluster import cluster_cpus
from moe_dag.engine.join import commit_blocks
from moe_dag.engine.shards import ShardInput, plan_shards
from moe_dag.engine.stage import StageSpec, merge_counts, process_shard, shard_error
from moe_dag.engine.warm import spec_key, warm_work
from moe_dag.storage.lake import Lake

LOG_EVERY_S = 10.0


class ShardStageError(RuntimeError):
    """Some shards of a stage failed; the others are done and a rerun redoes only the failed ones."""


@dataclass
class StageRun:
    stage: str
    source: str
    records: dict[str, dict[str, Any]]  # every finished shard of the source, done now or before
    shards_run: int
    shards_removed: int
    documents_run: int
    seconds: float
    keys_run: tuple[str, ...] = ()  # the shards done now

    @property
    def counts(self) -> dict[str, Any]:
        return merge_counts([record["counts"] for record in self.records.values()])

    @property
    def counts_run(self) -> dict[str, Any]:
        """The counts of the shards done now: what this run changed."""
        return merge_counts([self.records[key]["counts"] for key in self.keys_run])

    @property
    def documents_per_second(self) -> float:
        return self.documents_run / self.seconds if self.seconds > 0 else 0.0


def run_stage(
    spec: StageSpec,
    lake: Lake,
    source: str,
    inputs: list[ShardInput],
    *,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
    min_block_rows: int | None = None,
    min_block_bytes: int = MIN_BLOCK_BYTES,
) -> StageRun:
    """Bring `source`'s slice of the stage up to date with `inputs`.

    `workers`: shards processed at once on the connected Ray (None: one per CPU of the cluster); 0 runs
    them one after another in this process, without Ray (a debugger, a notebook). `min_block_rows`:
    when the stage has fewer shards to do than workers, its shards are split into blocks of at least
    this many rows to occupy the idle ones, each block its own task (blocks.py); None never splits.
    `min_block_bytes`: the same for blocks the stage's work counts in bytes (ingest's JSON-lines shards)."""
    plan = plan_shards(lake, spec.outputs, spec.params, source, inputs)
    name = f"{spec.stage} [{source}]"
    if log and (plan.done or plan.removed):
        done, todo, removed = len(plan.done), len(plan.todo), len(plan.removed)
        log(f"{name}: {done} shards already done, {todo} to do, {removed} removed")
    started = time.perf_counter()
    slots = 1 if workers == 0 else workers or cluster_cpus()
    least = None if min_block_rows is None else BlockSizes(min_block_rows, min_block_bytes)
    items, blocks, block_records = _work_items(spec, lake, source, plan.todo, slots, least)
    if log and blocks:
        log(f"{name}: {len(blocks)} shards split into {sum(map(len, blocks.values()))} blocks")
    records = dict(plan.done)
    errors, documents, finished, last_log = [], 0, 0, started
    with tqdm(total=len(items), desc=name, unit="task", disable=None if items else True) as bar:
        for result in _results(spec, lake, source, items, workers, slots):
            bar.update(1)
            finished += 1
            if "error" in result:
                errors.append(result["error"])
                continue
            if result.get("span") is None:
                records[result["key"]] = result["record"]
            else:
                block_records[result["key"]][tuple(result["span"])] = result["record"]
            documents += int(result["record"]["counts"].get("documents", 0))
            rate = documents / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(documents=documents, docs_per_s=round(rate))
            if log and time.perf_counter() - last_log >= LOG_EVERY_S:
                last_log = time.perf_counter()
                log(f"{name}: {finished}/{len(items)} done, {documents} documents, {rate:.0f} docs/s")
    complete = {key: parts for key, parts in blocks.items() if len(block_records[key]) == len(parts)}
    for result in _commits(spec, lake, source, complete, block_records, workers):
        if "error" in result:
            errors.append(result["error"])
        else:
            records[result["key"]] = result["record"]
    if blocks:  # the folders of joined shards go; the blocks of the others wait for the rerun
        clean_blocks(lake, spec.outputs, source, {k: v for k, v in blocks.items() if k not in records})
    seconds = time.perf_counter() - started
    if errors:
        raise ShardStageError(
            f"{name}: {len(errors)} of {len(items)} {'shards and blocks' if blocks else 'shards'} failed "
            "(the others are done; a rerun redoes only the failed ones):\n" + "\n".join(errors)
        )
    run = StageRun(
        spec.stage,
        source,
        dict(sorted(records.items())),
        len(plan.todo),
        len(plan.removed),
        documents,
        seconds,
        tuple(sorted(shard.key for shard in plan.todo)),
    )
    if log and plan.todo:
        rate = run.documents_per_second
        log(f"{name}: {run.shards_run} shards, {documents} documents in {seconds:.1f}s ({rate:.0f} docs/s)")
    return run


def _work_items(
    spec: StageSpec,
    lake: Lake,
    source: str,
    todo: list[ShardInput],
    slots: int,
    least: BlockSizes | None,
) -> tuple[list[ShardInput], dict[str, list[ShardInput]], dict[str, dict[tuple[int, int], dict]]]:
    """What to run: whole shards, and the unfinished blocks of the shards split now; returns the
    items, the blocks of each split shard and the block records already valid, by shard key.

    Splitting pays one more write of the shard (the commit), so it happens only when whole shards
    would leave workers idle: a source of many shards keeps every worker busy without it."""
    blocks: dict[str, list[ShardInput]] = {}
    if least is not None and spec.splittable and len(todo) < slots:
        for shard in todo:
            if len(parts := spec.work_class.split(lake, shard, math.ceil(slots / len(todo)), least)) > 1:
                blocks[shard.key] = parts
    clean_blocks(lake, spec.outputs, source, blocks)
    done = {key: finished_blocks(lake, spec.stage, source, blocks[key], spec.digest) for key in blocks}
    items = [shard for shard in todo if shard.key not in blocks]
    items += [block for key, parts in blocks.items() for block in parts if block.span not in done[key]]
    return items, blocks, done


def _results(
    spec: StageSpec, lake: Lake, source: str, todo: list[ShardInput], workers: int | None, slots: int
) -> Iterator[dict]:
    if not todo:
        return iter(())
    if workers == 0:
        return _in_process(spec, lake, source, todo)
    return _on_ray(spec, lake.url, source, todo, slots)


def _in_process(spec: StageSpec, lake: Lake, source: str, todo: list[ShardInput]) -> Iterator[dict]:
    work = spec.make_work()
    for shard in todo:
        yield process_shard(spec, work, lake, source, shard)


def _commits(
    spec: StageSpec,
    lake: Lake,
    source: str,
    blocks: dict[str, list[ShardInput]],
    records: dict[str, dict[tuple[int, int], dict]],
    workers: int | None,
) -> Iterator[dict]:
    """Join each fully done split shard's blocks into its file and record, as one task per shard."""
    calls = [
        (spec, lake.url, source, replace(parts[0], span=None), [records[key][b.span] for b in parts])
        for key, parts in blocks.items()
    ]
    if workers == 0:
        yield from (_commit(*call) for call in calls)
        return
    import ray

    pending = [_remote(_commit).remote(*call) for call in calls]
    while pending:
        ready, pending = ray.wait(pending)
        yield from ray.get(ready)


def _commit(spec: StageSpec, lake_url: str, source: str, shard: ShardInput, records: list[dict]) -> dict:
    return commit_blocks(spec, Lake(lake_url), source, shard, records)


def _on_ray(
    spec: StageSpec, lake_url: str, source: str, todo: list[ShardInput], workers: int
) -> Iterator[dict]:
    """Each shard (or block) as a Ray task, at most `workers` at once, in Ray's worker processes, which
    keep a warm spec's work built (warm.py); work that wants GPUs in actors of its own for this run."""
    import ray

    boxed_spec = [ray.put(spec)]  # sent once; a process that has the work built never fetches it
    if spec.num_gpus:
        yield from _on_gpu_actors(spec, boxed_spec, lake_url, source, todo, workers)
        return
    key, task = spec_key(spec) if spec.warm else None, _remote(_shard_task)

    def submit(shard: ShardInput, _slot: int) -> Any:
        return task.remote(key, boxed_spec, lake_url, source, shard)

    yield from _dispatch(todo, workers, submit)


def _on_gpu_actors(
    spec: StageSpec, boxed_spec: list, lake_url: str, source: str, todo: list[ShardInput], workers: int
) -> Iterator[dict]:
    """GPU work in a pool of its own, started for this stage run and ended with it: a pool kept would
    hold the GPUs' memory from the training that follows, and Ray gives a GPU task a fresh process
    every time (`max_calls=1`), which would load the model for every shard."""
    import ray

    actor = ray.remote(num_cpus=1, num_gpus=spec.num_gpus)(_GpuWorker)
    actors = [actor.remote(boxed_spec, lake_url, source) for _ in range(min(workers, len(todo)))]
    try:
        yield from _dispatch(todo, len(actors), lambda shard, slot: actors[slot].process.remote(shard))
    finally:
        for handle in actors:
            ray.kill(handle)


def _dispatch(todo: list[ShardInput], slots: int, submit: Callable[[ShardInput, int], Any]) -> Iterator[dict]:
    """Submit each item as a call on a free slot (`submit(item, slot)` returns its object ref), with
    at most `slots` in flight; yield the results as they come. A call whose worker died (killed, out of
    memory) gives that item's error, and the others go on."""
    import ray

    queue, free, pending = list(reversed(todo)), list(range(slots)), {}
    while queue or pending:
        while queue and free:
            shard, slot = queue.pop(), free.pop()
            pending[submit(shard, slot)] = (shard, slot)
        [ready], _ = ray.wait(list(pending), num_returns=1)
        shard, slot = pending.pop(ready)
        free.append(slot)
        try:
            yield ray.get(ready)
        except ray.exceptions.RayError as error:
            yield shard_error(shard, f"its worker failed: {error}")


_REMOTES: dict[Callable, Any] = {}


def _remote(fn: Callable) -> Any:
    """`fn` as a Ray task of one CPU, exported to the cluster once per process. A task whose worker
    died is retried once (another process, maybe another node): a shard that kills its worker twice
    would kill it again, and is reported instead."""
    import ray

    if fn not in _REMOTES:
        _REMOTES[fn] = ray.remote(num_cpus=1, max_retries=1)(fn)
    return _REMOTES[fn]


def _shard_task(key: str | None, boxed_spec: list, lake_url: str, source: str, shard: ShardInput) -> dict:
    """One shard in a task: with the work this process keeps for `key`, or one built for the shard."""
    try:
        spec, work = warm_work(key, boxed_spec)
    except Exception as error:
        return shard_error(shard, f"building the stage's work failed: {error!r}")
    return process_shard(spec, work, Lake(lake_url), source, shard)


class _GpuWorker:
    """One actor of a GPU stage run: builds the work (loads the model onto its GPU) once."""

    def __init__(self, boxed_spec: list, lake_url: str, source: str) -> None:
        import ray

        self.spec, self.lake, self.source = ray.get(boxed_spec[0]), Lake(lake_url), source
        self.work = self.spec.make_work()

    def process(self, shard: ShardInput) -> dict:
        return process_shard(self.spec, self.work, self.lake, self.source, shard)
