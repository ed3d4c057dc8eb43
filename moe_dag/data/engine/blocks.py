"""Blocks: a large shard split into ranges, so that one shard can keep many workers busy.

The shard stays the unit of the lake: downstream stages, the catalog and the checks see one file and
one completion record per shard, whether it was split or not. Splitting happens inside a stage run:

1. When a stage has fewer shards to do than workers, each shard of a splittable stage (its work reads
   its input only batch by batch and writes only tables: `ShardWork.splittable`) becomes as many
   blocks as give every worker one, but none under `min_block_rows` rows (a block costs a task and a
   share of the join), as its work's `ShardWork.split` cuts it. For a parquet input: even row ranges
   in whole read batches (`BATCH_ROWS`). Each block starts at a multiple of the read batch, so its
   batches are the very batches the whole shard would be read in: the same rows meet the same
   batch-wise work (scoring sorts and pads per batch). Ingest cuts raw shards its own way
   (`IngestWork`): byte ranges of a JSON-lines shard, none under `min_block_bytes`, and whole row
   groups of a parquet one; its blocks number their lines from 1 (`ShardWork.numbered_by`).
2. Each block is its own task or actor call. It writes `<stage>/source=<s>/_blocks/<key>/<start>-<stop>
   .parquet` and then its block record (`<start>-<stop>.json`, digest and counts), as a shard does; the
   `_` folder is invisible to every reader of the slice. A rerun after a crash redoes only the blocks
   without a valid record.
3. When all blocks of a shard are done, one commit task concatenates their files in order into the
   shard's file, row group by row group (the layout the whole shard would have had; work whose blocks
   end between its batches writes fixed row groups, `ShardWork.group_rows`, which the join keeps),
   renumbers lines through the shard, writes the shard's completion record (the digest an unsplit run
   gives, the block counts summed, what the work read as `ShardWork.joined_read` makes it) and removes
   the blocks.

So a split shard's output equals the unsplit run's (tests/test_engine.py holds them equal, and
tests/test_ingest_blocks.py byte for byte for ingest), and the next stage cannot tell which way it
was made.
"""

from __future__ import annotations

import itertools
import json
import math
import posixpath
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.data.atomic import TEMPORARY_PREFIX, atomic_write
from moe_dag.data.engine.shards import ShardInput, outputs_intact
from moe_dag.data.lake import BATCH_ROWS, Lake

if TYPE_CHECKING:
    from moe_dag.data.engine.stage import StageSpec

BLOCKS_DIR = "_blocks"
# The least bytes of a block counted in bytes (ingest's JSON-lines shards): about what the least rows of a
# block (8,192, `min_block_rows`) hold of web documents of a couple of KiB each.
MIN_BLOCK_BYTES = 16 << 20


@dataclass(frozen=True)
class BlockSizes:
    """The least a block may hold: rows (of a parquet input), bytes (of a JSON-lines raw shard)."""

    rows: int
    bytes: int = MIN_BLOCK_BYTES


def block_folder(lake: Lake, stage: str, source: str, key: str) -> str:
    return posixpath.join(lake.dataset_dir(stage, source), BLOCKS_DIR, key)


def block_name(span: tuple[int, int]) -> str:
    return f"{span[0]:012d}-{span[1]:012d}"


def block_path(lake: Lake, stage: str, source: str, shard: ShardInput, suffix: str = ".parquet") -> str:
    assert shard.span is not None
    return posixpath.join(block_folder(lake, stage, source, shard.key), block_name(shard.span) + suffix)


def row_count(lake: Lake, path: str) -> int:
    """Rows of a parquet file, from its footer (no data is read)."""
    with lake.fs.open(path, "rb") as handle:
        return pq.ParquetFile(handle).metadata.num_rows


def split(shard: ShardInput, rows: int, blocks: int) -> list[ShardInput]:
    """A shard of `rows` rows as at most `blocks` blocks of whole read batches, as even as they go."""
    step = math.ceil(math.ceil(rows / BATCH_ROWS) / blocks) * BATCH_ROWS
    return [replace(shard, span=(start, min(start + step, rows))) for start in range(0, rows, step)]


def read_rows(
    path: str, fs: fsspec.AbstractFileSystem, rows: tuple[int, int], batch_rows: int = BATCH_ROWS
) -> Iterator[pa.Table]:
    """Rows [start, stop) of a parquet file in tables of `batch_rows` rows counted from `start` (the
    last may be shorter), reading only the row groups that hold them. With `start` a multiple of
    `batch_rows` these are the batches `read_batches` gives for the same rows of the whole file."""
    start, stop = rows
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        groups, first_row, position = [], None, 0
        for index in range(parquet.metadata.num_row_groups):
            size = parquet.metadata.row_group(index).num_rows
            if position + size > start and position < stop:
                groups.append(index)
                first_row = position if first_row is None else first_row
            position += size
        schema = parquet.schema_arrow
        if not groups:
            yield schema.empty_table()
            return
        position, pending, held = first_row, [], 0
        for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=groups):
            piece = pa.Table.from_batches([batch], schema=schema)
            lo, hi = max(start - position, 0), min(stop - position, piece.num_rows)
            position += piece.num_rows
            if hi <= lo:
                continue
            pending.append(piece.slice(lo, hi - lo))
            held += hi - lo
            while held >= batch_rows:
                merged = pa.concat_tables(pending)
                yield merged.slice(0, batch_rows)
                pending, held = [merged.slice(batch_rows)], held - batch_rows
        if held:
            yield pa.concat_tables(pending)


def write_block_record(lake: Lake, stage: str, source: str, shard: ShardInput, record: dict) -> None:
    with atomic_write(block_path(lake, stage, source, shard, ".json"), lake.fs) as handle:
        handle.write(json.dumps(record, sort_keys=True).encode())


def finished_blocks(
    lake: Lake, stage: str, source: str, blocks: list[ShardInput], digest: Callable[[ShardInput], str]
) -> dict[tuple[int, int], dict[str, Any]]:
    """Block records still valid (digest as `digest(block)` gives it, files intact), by span."""
    folder = block_folder(lake, stage, source, blocks[0].key)
    wanted = {block_name(block.span): block for block in blocks}
    found = {}
    for path in lake.files_matching(folder, "*.json"):
        block = wanted.get(posixpath.basename(path).removesuffix(".json"))
        if block is None:
            continue
        with lake.fs.open(path, "rb") as handle:
            record = json.loads(handle.read())
        if record.get("digest") == digest(block) and outputs_intact(lake, record):
            found[block.span] = record
    return found


def clean_blocks(lake: Lake, stages: tuple[str, ...], source: str, keep: dict[str, list[ShardInput]]) -> None:
    """Remove block folders of shards not split now, and in the others files of other ranges and
    temporaries a killed run left (`keep`: the blocks of each shard split in this run)."""
    for stage in stages:
        root = posixpath.join(lake.dataset_dir(stage, source), BLOCKS_DIR)
        if not lake.fs.exists(root):
            continue
        for folder in lake.fs.ls(root, detail=False):
            key = posixpath.basename(folder.rstrip("/"))
            if key not in keep:
                lake.fs.rm(folder, recursive=True)
                continue
            names = {block_name(block.span) for block in keep[key]}
            for path in lake.files_matching(folder, "*"):
                name = posixpath.basename(path)
                if name.startswith(TEMPORARY_PREFIX) or name.split(".")[0] not in names:
                    lake.fs.rm(path)
        if not lake.fs.ls(root, detail=False):
            lake.fs.rm(root, recursive=True)


def commit_blocks(
    spec: StageSpec, lake: Lake, source: str, shard: ShardInput, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Concatenate a shard's finished blocks (`records`, in order) into the shard's files and write its
    completion record; returns {key, record} or {key, error}, as `process_shard` does. Work that numbers
    its input's lines per block (`ShardWork.numbered_by`) has them renumbered through the shard, and work
    that says what it read has the shard's `read` made from its blocks' (`ShardWork.joined_read`)."""
    from moe_dag.data.engine.stage import ShardOutput, merge_counts, node_id  # stage imports this module

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
