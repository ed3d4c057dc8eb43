"""Joining a split shard: its finished blocks concatenated, in order, into the shard's files and its
completion record (step 3 of blocks.py)."""

from __future__ import annotations

import itertools
import posixpath
import time
import traceback
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.engine.blocks import block_folder, block_path
from moe_dag.engine.shards import ShardInput
from moe_dag.engine.stage import ShardOutput, StageSpec, merge_counts, node_id
from moe_dag.storage.lake import Lake


def commit_blocks(
    spec: StageSpec, lake: Lake, source: str, shard: ShardInput, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Concatenate a shard's finished blocks (`records`, in order) into the shard's files and write its
    completion record; returns {key, record} or {key, error}, as `process_shard` does. Work that numbers
    its input's lines per block (`ShardWork.numbered_by`) has them renumbered through the shard, and work
    that says what it read has the shard's `read` made from its blocks' (`ShardWork.joined_read`)."""
    started, stages, node, work = time.perf_counter(), spec.outputs, node_id(), spec.work_class
    blocks = [replace(shard, span=tuple(record["span"])) for record in records]
    numbered_by = None if work is None else work.numbered_by
    # The line numbers the blocks before each took (a block's `read` says how many it took).
    shifts = [0] * len(records)
    if numbered_by is not None:
        shifts = list(itertools.accumulate((r["read"]["lines"] for r in records[:-1]), initial=0))
    try:
        read = None if work is None else work.joined_read(shard, [r.get("read") for r in records])
        with ShardOutput(lake, source, shard.key, group_rows=spec.group_rows) as out:
            for stage in stages:
                paths = [block_path(lake, stage, source, block) for block in blocks]
                written = zip(paths, records, shifts, strict=True)
                files = [(p, shift) for p, r, shift in written if _relative(lake, p) in r["outputs"]]
                _concatenate(lake, files, out, stage, numbered_by)
        record = {
            "key": shard.key,
            "input": shard.path,
            "fingerprint": shard.fingerprint,
            "digest": spec.digest(shard),
            "counts": merge_counts([record["counts"] for record in records]),
            # Worker-seconds of the blocks and the commit: what the shard cost, not how long it took.
            "seconds": round(sum(r["seconds"] for r in records) + time.perf_counter() - started, 3),
            **({"read": read} if read is not None else {}),
            "blocks": len(records),
            "nodes": sorted({n for r in records for n in r.get("nodes", [])} | ({node} if node else set())),
            "outputs": out.sizes(),
        }
        lake.write_record(stages[0], source, shard.key, record)
        for stage in stages:
            if lake.fs.exists(folder := block_folder(lake, stage, source, shard.key)):
                lake.fs.rm(folder, recursive=True)
    except Exception as error:
        detail = "".join(traceback.format_exception_only(error)).strip()
        return {"key": shard.key, "error": f"shard {shard.path} (joining {len(records)} blocks): {detail}"}
    return {"key": shard.key, "record": record}


def _relative(lake: Lake, path: str) -> str:
    return posixpath.relpath(path, lake.root)


def _concatenate(
    lake: Lake, files: list[tuple[str, int]], out: Any, stage: str, numbered_by: str | None
) -> None:
    """The blocks' files of one output stage (each with the line numbers the blocks before it took),
    row group by row group, into the shard's file (which is written with the first block's schema even
    when every block is empty)."""
    writer = None
    for path, shift in files:
        with lake.fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            writer = writer or out.table(stage, parquet.schema_arrow)
            for index in range(parquet.metadata.num_row_groups):
                writer.write(_renumbered(parquet.read_row_group(index), numbered_by, shift))


def _renumbered(table: pa.Table, column: str | None, shift: int) -> pa.Table:
    if column is None or not shift or column not in table.column_names:
        return table
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(index), pc.add(table[column], shift))
