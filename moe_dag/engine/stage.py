"""What a per-source stage does to one shard, and the plain function that does it anywhere.

A stage is described by a `StageSpec`: the lake stages it writes, a picklable factory for its
`ShardWork` (called on the worker), and whether that work holds a model or a large table (then each
worker process keeps it built, so a model loads once per process, not once per shard). `process_shard`
runs the work on one shard and commits it: every output file is written under a temporary name, all
are renamed into place, and only then is the completion record written. A shard killed at any point
is therefore either done (record present, files complete) or redone on the next run.

`process_shard` is a plain function: the Ray engine calls it in tasks (actors for GPU work), a test or
a notebook can call it in a loop.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.engine.blocks import BlockSizes, block_path, read_rows, row_count, split, write_block_record
from moe_dag.engine.shards import ShardInput, file_sizes, shard_digest
from moe_dag.storage.atomic import atomic_write, write_error
from moe_dag.storage.lake import Lake, read_batches
from moe_dag.storage.schema import kept_rows, parquet_write_options, reason_counts


class ShardWork(ABC):
    """A stage's work on one shard. Built once per worker process (`StageSpec.warm`) and used for many
    shards, of one stage run or several: load models in `__init__`, keep no state between shards."""

    # Whether a block of the shard (`shard.span`, as `split` makes them) can be processed alone and the
    # blocks' tables joined into the whole shard's output (blocks.py): true of work that reads its input
    # only through `kept_batches` (or another reader of blocks), decides row by row (or batch by batch)
    # and writes only tables.
    splittable: ClassVar[bool] = False
    # Row groups of exactly this many rows in the shard's files (the last one shorter), however the work
    # batches its writes: for work whose blocks end between its batches (ingest's byte ranges), so that
    # the join can give the blocks' rows the whole shard's layout. None: a row group per table written.
    group_rows: ClassVar[int | None] = None
    # A column numbering the input's lines (rows) from 1 within each block: the join adds the numbers
    # the blocks before took (the `lines` of each block's `out.read`). None: no such column.
    numbered_by: ClassVar[str | None] = None

    @classmethod
    def split(cls, lake: Lake, shard: ShardInput, blocks: int, least: BlockSizes) -> list[ShardInput]:
        """`shard` as at most `blocks` blocks, none under `least` (fewer than two: it stays whole). Here
        row ranges of a parquet input in whole read batches (`kept_batches` reads them)."""
        rows = row_count(lake, shard.path)
        count = min(blocks, rows // least.rows)
        return split(shard, rows, count) if count > 1 else []

    @classmethod
    def joined_read(cls, shard: ShardInput, reads: list[dict[str, Any] | None]) -> dict[str, Any] | None:
        """What a shard joined from blocks read (its record's `read`), from the blocks' own `out.read`s
        in order; None: the work says nothing of what it read."""
        return None

    @abstractmethod
    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        """Read `shard.path`, write through `out`, return counts (numbers, nested dicts of numbers);
        `counts["documents"]` is the number of documents the shard brought in, for progress."""


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    outputs: tuple[str, ...]  # lake stages written per shard; the first holds the completion records
    make_work: Callable[[], ShardWork]  # picklable; runs on the worker
    params: str = ""  # everything besides the input the output depends on (config, model versions)
    # Work holding a model or a large table: each worker process keeps it built for the shards and stage
    # runs that follow (warm.py); else it is built afresh for each shard.
    warm: bool = False
    num_gpus: float = 0.0  # per worker: GPU work runs in actors of its own (run.py)

    @property
    def stage(self) -> str:
        return self.outputs[0]

    def digest(self, shard: ShardInput) -> str:
        return shard_digest(self.stage, self.params, shard)

    @property
    def work_class(self) -> type[ShardWork] | None:
        """The work's class, read off the factory (a class or a `functools.partial` of one), so that the
        driver builds no model to learn what the class declares (splitting, row groups)."""
        factory = getattr(self.make_work, "func", self.make_work)
        return factory if isinstance(factory, type) and issubclass(factory, ShardWork) else None

    @property
    def splittable(self) -> bool:
        """Whether the work's class says its shards may be split into blocks."""
        return self.work_class is not None and self.work_class.splittable

    @property
    def group_rows(self) -> int | None:
        return None if self.work_class is None else self.work_class.group_rows


class TableWriter:
    """Streams tables into one shard file; the file appears at its final path only on commit. With
    `group_rows`, the rows go into row groups of exactly that many rows (the last one shorter), each
    written from one contiguous table, so the file depends on the rows alone, not on how they came."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        lake: Lake,
        path: str,
        schema: pa.Schema | None,
        group_rows: int | None = None,
    ) -> None:
        self._stack, self._lake, self.path, self._schema = stack, lake, path, schema
        self._group_rows, self._held = group_rows, []  # rows waiting for a whole row group
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if self._group_rows is None:
            self._write(table)
            return
        self._held.append(table)
        if sum(held.num_rows for held in self._held) < self._group_rows:
            return
        rows = pa.concat_tables(self._held)
        while rows.num_rows >= self._group_rows:
            self._write(rows.slice(0, self._group_rows).combine_chunks())
            rows = rows.slice(self._group_rows)
        self._held = [rows]

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            handle = self._stack.enter_context(atomic_write(self.path, self._lake.fs))
            self._writer = pq.ParquetWriter(handle, table.schema, **parquet_write_options(table.schema))
            self._stack.callback(self._writer.close)  # runs before the rename above
        try:
            self._writer.write_table(table)
        except OSError as error:  # a full disk: name the file written, not only the shard read
            raise write_error(error, self.path) from error

    def finish(self) -> None:
        """Write the rows still held; a shard with no rows still gets its file, so downstream stages
        learn the schema."""
        if self._held and (rest := pa.concat_tables(self._held)).num_rows:
            self._write(rest.combine_chunks())
        if self._writer is None and self._schema is not None:
            self._write(self._schema.empty_table())


class ShardOutput:
    """The files one shard writes, committed together by `process_shard`."""

    def __init__(
        self,
        lake: Lake,
        source: str,
        key: str,
        block: ShardInput | None = None,
        group_rows: int | None = None,
    ) -> None:
        self.lake, self.source, self.key = lake, source, key
        self.block = block  # writing one block of the shard: files go to its block folder (blocks.py)
        self.group_rows = group_rows  # the row groups of every table (`ShardWork.group_rows`)
        # What the work saw of its input file (size, checksum), kept as is in the completion record.
        self.read: dict[str, Any] | None = None
        self._stack = contextlib.ExitStack()
        self._tables: list[TableWriter] = []
        self._paths: list[str] = []

    def table(self, stage: str, schema: pa.Schema | None = None) -> TableWriter:
        """A writer for `lake/<stage>/source=<s>/<key>.parquet`; with `schema`, written even if empty."""
        if self.block is None:
            path = self.lake.shard_path(stage, self.source, self.key)
        else:
            path = block_path(self.lake, stage, self.source, self.block)
        writer = TableWriter(self._stack, self.lake, path, schema, self.group_rows)
        self._tables.append(writer)
        return writer

    def local_path(self, stage: str, suffix: str) -> Path:
        """A temporary local path for a file that takes a path to write (`<key><suffix>` at commit)."""
        assert self.block is None, "work that writes files by path is not splittable"
        final = self.lake.shard_path(stage, self.source, self.key, suffix)
        self._paths.append(final)
        return self._stack.enter_context(self.lake.local_file_for_writing(final))

    def sizes(self) -> dict[str, int]:
        """Bytes of each file committed, by path below the lake root: what the completion record
        vouches for."""
        return file_sizes(self.lake, [*self._paths, *(writer.path for writer in self._tables)])

    def __enter__(self) -> ShardOutput:
        return self

    def __exit__(self, *failure: Any) -> None:
        if failure[0] is None:
            for writer in self._tables:
                writer.finish()
            self._stack.__exit__(None, None, None)
            return
        # Failing already: remove the partial files, and let the original error through rather than the
        # "could not write" each of them would add.
        with contextlib.suppress(Exception):
            self._stack.__exit__(*failure)


def process_shard(
    spec: StageSpec, work: ShardWork, lake: Lake, source: str, shard: ShardInput
) -> dict[str, Any]:
    """Do one shard and write its completion record. Returns {key, record} or {key, error}: a failed
    shard leaves nothing behind, and the others go on."""
    started, block = time.perf_counter(), None if shard.span is None else shard
    try:
        with ShardOutput(lake, source, shard.key, block, spec.group_rows) as out:
            counts = work.process(shard, out)
        node = node_id()
        record = {
            "key": shard.key,
            "input": shard.path,
            "fingerprint": shard.fingerprint,
            "digest": spec.digest(shard),
            "counts": counts,
            "seconds": round(time.perf_counter() - started, 3),
            **({"read": out.read} if out.read is not None else {}),
            **({"span": list(shard.span)} if shard.span is not None else {}),
            "nodes": [node] if node else [],  # the Ray node that did the work
            "outputs": out.sizes(),
        }
        if block is None:
            lake.write_record(spec.stage, source, shard.key, record)
        else:
            write_block_record(lake, spec.stage, source, shard, record)
    except Exception as error:
        return shard_error(shard, "".join(traceback.format_exception_only(error)).strip())
    return {"key": shard.key, "span": shard.span, "record": record}


def shard_error(shard: ShardInput, detail: str) -> dict[str, Any]:
    """The result of a shard (or block) that failed: what the stage reports, naming its file."""
    where = "" if shard.span is None else f" (block {shard.span[0]}-{shard.span[1]})"
    return {"key": shard.key, "span": shard.span, "error": f"shard {shard.path}{where}: {detail}"}


def node_id() -> str | None:
    """The id of the Ray node this process runs on; None outside Ray (a plain loop, a notebook)."""
    ray = sys.modules.get("ray")  # a process that never imported Ray is not on a Ray node
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def merge_counts(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum count dicts key by key, recursing into nested dicts."""
    total: dict[str, Any] = {}
    for one in counts:
        for name, value in one.items():
            if isinstance(value, dict):
                total[name] = merge_counts([total.get(name, {}), value])
            else:
                total[name] = total.get(name, 0) + value
    return total


def kept_batches(shard: ShardInput, out: ShardOutput) -> Iterator[pa.Table]:
    """The input shard's rows that its stage kept (all rows when it made no decision), in batches; of a
    block, the kept rows among its rows."""
    if shard.span is None:
        batches = read_batches(shard.path, out.lake.fs)
    else:
        batches = read_rows(shard.path, out.lake.fs, shard.span)
    for batch in batches:
        yield kept_rows(batch) if "keep" in batch.column_names else batch


def decision_counts(decided: pa.Table) -> dict[str, Any]:
    kept = int(pc.sum(decided["keep"]).as_py() or 0)
    return {
        "documents": decided.num_rows,
        "kept": kept,
        "dropped": decided.num_rows - kept,
        "reasons": reason_counts(decided),
    }
