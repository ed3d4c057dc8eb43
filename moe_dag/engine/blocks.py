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

import json
import math
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from moe_dag.engine.shards import ShardInput, outputs_intact
from moe_dag.storage.atomic import TEMPORARY_PREFIX, atomic_write
from moe_dag.storage.lake import BATCH_ROWS, Lake

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
