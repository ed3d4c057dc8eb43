"""Ingest one source: read its raw shards into the lake, then quarantine ids repeated within it.

The id rule. Document ids are namespaced by source when read (`<source>/<id in the shard>`), so sources
may share ids. Within a source an id must be unique: of the rows carrying one id, the first in (shard
path, line) order stays a document and every later one moves to the quarantine, with its own shard and
line and an error naming where the id was first seen. The rule depends only on the shards present, so
adding, changing or removing a shard gives the same lake as reading the source from scratch:

- shards are read in parallel (`IngestWork`), each on its own, so repeats across shards are found
  afterwards, out of core, by one DuckDB query over the source's `raw_documents` files (a large shard
  with workers to spare is read in blocks, joined into the file an unsplit read writes: the engine's
  blocks, `moe_dag.engine.blocks`);
- a shard whose rows move is rewritten and gets a new digest, so the stages after it redo it;
- when a shard is removed or changed, the shards that had quarantined repeats are read again from
  their raw files, because the row they repeated may be gone.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.curation.work import IngestWork
from moe_dag.engine import ShardInput, StageRun, StageSpec, raw_shard_inputs, run_stage
from moe_dag.engine.blocks import MIN_BLOCK_BYTES
from moe_dag.engine.shards import digest_text, file_sizes
from moe_dag.engine.tasks import map_tasks
from moe_dag.storage.lake import Lake
from moe_dag.storage.object_store import ObjectStoreError
from moe_dag.storage.readers import MAX_RAW_CHARS, list_shards
from moe_dag.storage.schema import QUARANTINE_SCHEMA

INGEST = StageSpec(outputs=("raw_documents", "quarantine"), make_work=IngestWork)
DUPLICATE_ID = "duplicate id"

REPEATS_SQL = """
SELECT shard, line, id, first_shard, first_line FROM (
    SELECT shard, line, id,
           first_value(shard) OVER by_id AS first_shard,
           first_value(line) OVER by_id AS first_line,
           row_number() OVER by_id AS occurrence
    FROM read_parquet(?)
    WINDOW by_id AS (PARTITION BY id ORDER BY shard, line)
) WHERE occurrence > 1 ORDER BY shard, line
"""


def ingest_source(
    lake: Lake,
    source: str,
    location: str,
    *,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
    min_block_rows: int | None = None,
    min_block_bytes: int = MIN_BLOCK_BYTES,
) -> StageRun:
    """Bring `raw_documents` and `quarantine` of `source` up to date with the shards under `location`.
    With fewer shards to read than workers, a shard splits into blocks of at least `min_block_bytes`
    bytes (JSON lines) or `min_block_rows` rows (parquet), as `run_stage` splits; None: never."""
    try:
        inputs = raw_shard_inputs(list_shards(location), location)
    except ObjectStoreError as error:  # one error for the source, before any shard is begun
        raise ObjectStoreError(f"source {source!r}: {error}") from None
    _reread_after_changes(lake, source, inputs)
    run = run_stage(
        INGEST,
        lake,
        source,
        inputs,
        workers=workers,
        log=log,
        min_block_rows=min_block_rows,
        min_block_bytes=min_block_bytes,
    )
    moved = quarantine_repeated_ids(lake, source)
    if moved and log:
        log(f"raw_documents [{source}]: {moved} rows with a repeated id moved to the quarantine")
    run.records = lake.records("raw_documents", source)
    return run


def quarantine_repeated_ids(lake: Lake, source: str) -> int:
    """Move every repeat of an id within the source to the quarantine; returns how many rows moved."""
    files = lake.parquet_files("raw_documents", source)
    if not files:
        return 0
    with duckdb.connect() as con:
        repeats = con.sql(REPEATS_SQL, params=[lake.duckdb_paths(con, files)]).to_arrow_table()
    if not repeats.num_rows:
        return 0
    key_of = {record["input"]: key for key, record in lake.records("raw_documents", source).items()}
    moves = [
        (key_of[shard], repeats.filter(pc.equal(repeats["shard"], shard)))
        for shard in pc.unique(repeats["shard"]).to_pylist()
    ]
    # Each shard is rewritten in a task of its own: its documents never pass through this process.
    map_tasks(functools.partial(_move_to_quarantine, lake.url, source), moves)
    return repeats.num_rows


def _move_to_quarantine(lake_url: str, source: str, move: tuple[str, pa.Table]) -> None:
    """Rewrite one shard (key) without its repeats. The record goes first: a kill half way leaves a shard
    without record, which the next run reads again from its raw file."""
    lake, (key, repeats) = Lake(lake_url), move
    record = lake.read_record("raw_documents", source, key)
    lake.remove_record("raw_documents", source, key)
    documents = lake.read_file(lake.shard_path("raw_documents", source, key))
    is_repeat = pc.is_in(documents["line"], value_set=repeats["line"])
    moved = documents.filter(is_repeat)
    first_seen = {row["line"]: row for row in repeats.to_pylist()}
    rows = [
        {
            "source": source,
            "shard": row["shard"],
            "line": row["line"],
            "error": f"{DUPLICATE_ID} {row['id']!r}: first at {first_seen[row['line']]['first_shard']} "
            f"line {first_seen[row['line']]['first_line']}",
            "raw": json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False)[:MAX_RAW_CHARS],
        }
        for row in moved.select(["shard", "line", "id", "text"]).to_pylist()
    ]
    quarantine_path = lake.shard_path("quarantine", source, key)
    earlier = [lake.read_file(quarantine_path)] if lake.fs.exists(quarantine_path) else []
    quarantine = pa.concat_tables([*earlier, pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)])
    lake.write_file(quarantine.sort_by("line"), quarantine_path)
    documents_path = lake.shard_path("raw_documents", source, key)
    lake.write_file(documents.filter(pc.invert(is_repeat)), documents_path)
    counts = record["counts"]
    counts.update(
        kept=counts["kept"] - len(rows),
        quarantined=counts["quarantined"] + len(rows),
        duplicate_ids=counts.get("duplicate_ids", 0) + len(rows),
    )
    # The output changed while the input did not: stages after this one see a new output digest and
    # redo the shard, while this stage's plan still finds it done.
    moved_lines = ",".join(str(line) for line in sorted(first_seen))
    record["output_digest"] = digest_text(record["digest"], f"moved lines {moved_lines}")
    record["outputs"] = {**record.get("outputs", {}), **file_sizes(lake, [documents_path, quarantine_path])}
    lake.write_record("raw_documents", source, key, record)


def _reread_after_changes(lake: Lake, source: str, inputs: list[ShardInput]) -> None:
    """A removed or changed shard may have held the first row of an id that others repeat: forget the
    shards that quarantined repeats, so they are read again."""
    records = lake.records("raw_documents", source)
    current = {shard.key: INGEST.digest(shard) for shard in inputs}
    if all(current.get(key) == record["digest"] for key, record in records.items()):
        return
    for key, record in records.items():
        if record["counts"].get("duplicate_ids"):
            lake.remove_record("raw_documents", source, key)
