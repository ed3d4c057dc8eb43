"""Counts taken apart from the stage that produced the rows, for reconciliation checks that can fail.

A stage's completion records count what the stage itself saw, so a check built on them alone cannot
catch a stage that lost rows before counting them. These counts come from elsewhere:

- `count_shard_lines`: the records in a raw shard by a plain line count of its decompressed bytes
  (non-blank lines; a parquet shard's row count from its footer), without parsing JSON. The bytes come
  through the reader's own `decompressed_chunks` (its BOM rule, its detection of a cut stream), so the
  two differ only if the reader loses or invents lines. Ingest turns
  every such line into at least one document or quarantine row carrying the line's number, so the
  distinct (shard, line) pairs in `raw_documents` and `quarantine` must equal it shard by shard.
- `lines_in_lake`: those distinct pairs, by one DuckDB query over the slice's parquet files.
- `slice_counts`: rows and kept rows of a stage's slice, read from its parquet files (the `keep`
  column only), which is what the next stage must have received.
- `language_counts`: documents in and kept per language of a stage's slice, for the check that no
  stage empties a language of a source.

Each count runs where the data is: one Ray task per group of files (`map_tasks`), returning numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import duckdb
import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.engine import ShardInput, raw_shard_inputs
from moe_dag.engine.tasks import map_tasks
from moe_dag.storage.lake import Lake
from moe_dag.storage.readers import LINE_END, StreamCut, decompressed_chunks, list_shards
from moe_dag.storage.schema import DUPLICATE_REASONS, LANGUAGE_NOT_ACCEPTED

LINE_COUNTS = "shard_lines"  # lake folder of cached counts: shard_lines/source=<s>/_done/<key>.json


def count_shard_lines(path: str) -> int:
    """Records in one raw shard: its non-blank lines (plus one for a compressed stream cut short, whose
    tail ingest quarantines as one record), or a parquet shard's rows."""
    if path.endswith(".parquet"):
        with fsspec.open(path, "rb") as handle:
            return pq.ParquetFile(handle).metadata.num_rows
    lines, pending = 0, b""
    with fsspec.open(path, "rb") as raw:
        try:
            for chunk in decompressed_chunks(raw, path):
                pieces = LINE_END.split(pending + chunk)
                pending = pieces.pop()
                if chunk.endswith(b"\r"):  # the first half of a CRLF split across chunks
                    pending = pieces.pop() + b"\r"
                lines += sum(1 for piece in pieces if piece.strip())
        except StreamCut:
            return lines + 1  # the cut tail, which ingest quarantines as one record
    return lines + sum(1 for piece in LINE_END.split(pending) if piece.strip())


def shard_line_counts(
    lake: Lake, source: str, shards: list[ShardInput], workers: int | None = None
) -> dict[str, int]:
    """Line counts of `source`'s raw shards by shard path, counted once per shard fingerprint (cached in
    the lake), as Ray tasks (`workers` as the engine takes it)."""
    cached = lake.records(LINE_COUNTS, source)
    fresh = {
        s.key: cached[s.key]["lines"]
        for s in shards
        if cached.get(s.key, {}).get("fingerprint") == s.fingerprint
    }
    todo = [s for s in shards if s.key not in fresh]
    counted = map_tasks(count_shard_lines, [s.path for s in todo], workers=workers)
    for shard, lines in zip(todo, counted, strict=True):
        lake.write_record(LINE_COUNTS, source, shard.key, {"fingerprint": shard.fingerprint, "lines": lines})
        fresh[shard.key] = lines
    for stale in set(cached) - {s.key for s in shards}:
        lake.remove_record(LINE_COUNTS, source, stale)
    return {s.path: fresh[s.key] for s in shards}


def unreconciled_shards(lake: Lake, source: str, location: str, workers: int | None = None) -> list[str]:
    """One sentence per shard of `source` whose line count differs from the distinct lines its rows
    in `raw_documents` and `quarantine` carry."""
    counted = shard_line_counts(lake, source, raw_shard_inputs(list_shards(location), location), workers)
    in_lake = lines_in_lake(lake, ("raw_documents", "quarantine"), source)
    return [
        f"{path}: {lines} lines in the file, {in_lake.get(path, 0)} in the lake"
        for path, lines in sorted(counted.items())
        if in_lake.get(path, 0) != lines
    ]


def lines_in_lake(lake: Lake, stages: Iterable[str], source: str) -> dict[str, int]:
    """Distinct (shard, line) pairs over the rows of `stages` for `source`, by shard path."""
    files = [path for stage in stages for path in lake.parquet_files(stage, source)]
    if not files:
        return {}
    with duckdb.connect() as con:
        query = "SELECT shard, count(DISTINCT line) FROM read_parquet(?, union_by_name = true) GROUP BY shard"
        return dict(con.execute(query, [lake.duckdb_paths(con, files)]).fetchall())


def slice_counts(lake: Lake, stage: str, source: str) -> tuple[int, int]:
    """(rows, kept rows) of a stage's slice from its files; a stage without `keep` passes on every row."""
    counted = map_tasks(functools.partial(file_counts, lake.url), lake.parquet_files(stage, source))
    return sum(rows for rows, _ in counted), sum(kept for _, kept in counted)


def file_counts(lake_url: str, path: str) -> tuple[int, int]:
    """(rows, kept rows) of one parquet file of the lake at `lake_url`."""
    with Lake(lake_url).fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        count = parquet.metadata.num_rows
        if "keep" not in parquet.schema_arrow.names or not count:
            return count, count
        return count, int(pc.sum(parquet.read(columns=["keep"])["keep"]).as_py() or 0)


# Rows not counted for their language: text language ID could not place, and languages the source does
# not accept (dropping those is the rule doing its job).
UNPLACED_LANGUAGES = ("und",)


def language_counts(lake: Lake, stage: str, source: str) -> dict[str, tuple[int, int]]:
    """(documents in, documents kept) per language of a stage's slice, from its parquet files; {} when its
    rows carry no `language` (language ID did not run). Unplaced text and rows dropped because the source
    does not accept their language are not counted, nor duplicates: their text lives on in the survivor
    of their cluster, in this source or another. Counted per file in Ray tasks (`map_tasks`): only counts
    come back."""
    per_file = map_tasks(functools.partial(file_language_counts, lake.url), lake.parquet_files(stage, source))
    if not per_file or any(counts is None for counts in per_file):
        return {}
    totals: dict[str, tuple[int, int]] = {}
    for counts in per_file:
        for language, (documents, kept) in counts.items():
            before = totals.get(language, (0, 0))
            totals[language] = (before[0] + documents, before[1] + kept)
    return totals


def file_language_counts(lake_url: str, path: str) -> dict[str, tuple[int, int]] | None:
    """`language_counts` of one parquet file (None when its rows carry no `language`)."""
    with Lake(lake_url).fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        if "language" not in parquet.schema_arrow.names:
            return None
        rows = parquet.read(columns=["language", "keep", "reason"])
    not_counted = pc.fill_null(
        pc.is_in(rows["reason"], pa.array([LANGUAGE_NOT_ACCEPTED, *DUPLICATE_REASONS])), False
    )
    unplaced = pc.or_(pc.is_null(rows["language"]), pc.is_in(rows["language"], pa.array(UNPLACED_LANGUAGES)))
    rows = rows.filter(pc.invert(pc.or_(not_counted, unplaced)))
    grouped = rows.group_by("language").aggregate([("keep", "count"), ("keep", "sum")])
    return {row["language"]: (row["keep_count"], row["keep_sum"]) for row in grouped.to_pylist()}
