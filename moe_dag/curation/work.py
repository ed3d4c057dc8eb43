"""The shard work of the curation stages: plain library calls over a shard's Arrow batches.

Each class is built once per worker and then processes shards: it streams the input shard in batches,
calls the stage's library function on each batch (`read_shard_batches`, `run_filters`,
`compute_signatures`, `ShardClusters.apply`), and writes each result batch to the shard's output file.
The library functions know nothing of shards or Ray.

Counts returned per shard: `documents` (rows the stage received), and for stages that decide, `kept`,
`dropped` and `reasons` (dropped rows per reason code); they add up over shards into the stage's
reconciliation.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from moe_dag.curation.dedup import MinHashConfig, ShardClusters, compute_signatures
from moe_dag.curation.dedup.clusters import EMPTY_VERSION
from moe_dag.curation.dedup.partitioned import CLUSTERS_STAGE, cluster_file_name
from moe_dag.curation.filters import DocumentFilter, run_filters
from moe_dag.engine.blocks import BlockSizes
from moe_dag.engine.shards import ShardInput
from moe_dag.engine.stage import ShardOutput, ShardWork, decision_counts, kept_batches, merge_counts
from moe_dag.storage.lake import BATCH_ROWS, Lake
from moe_dag.storage.readers import joined_read, read_block_batches, read_shard_batches, shard_spans
from moe_dag.storage.schema import DOCUMENT_SCHEMA, QUARANTINE_SCHEMA


class IngestWork(ShardWork):
    """raw_documents and quarantine from one raw shard, or from one block of it: a byte range of an
    uncompressed JSON-lines shard, whole row groups of a parquet one (readers.py; a gzip or zstd shard
    cannot be entered in the middle of its stream, so it is never split). A block numbers its lines
    from 1; the join renumbers them through the shard, writes the rows in the row groups a whole run
    writes (`group_rows`: a block ends anywhere between the reader's batches) and hashes the raw file
    once for the ledger, so a split shard's files and record equal an unsplit run's."""

    splittable = True
    group_rows = BATCH_ROWS
    numbered_by = "line"

    @classmethod
    def split(cls, lake: Lake, shard: ShardInput, blocks: int, least: BlockSizes) -> list[ShardInput]:
        spans = shard_spans(shard.path, blocks, least.rows, least.bytes)
        return [dataclasses.replace(shard, span=span) for span in spans]

    @classmethod
    def joined_read(cls, shard: ShardInput, reads: list[dict[str, Any] | None]) -> dict[str, Any] | None:
        return dataclasses.asdict(joined_read(shard.path, [read for read in reads if read is not None]))

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        documents = out.table("raw_documents", DOCUMENT_SCHEMA)
        quarantine = out.table("quarantine", QUARANTINE_SCHEMA)
        counts = Counter(records=0, kept=0, quarantined=0)
        if shard.span is None:
            pieces = read_shard_batches(shard.path, out.source)
        else:
            pieces = read_block_batches(shard.path, out.source, shard.span)
        for piece in pieces:
            if piece.read is not None:
                out.read = dataclasses.asdict(piece.read)
            documents.write(piece.documents)
            if piece.quarantine.num_rows:
                quarantine.write(piece.quarantine)
            counts.update(
                records=piece.records_read,
                kept=piece.documents.num_rows,
                quarantined=piece.quarantine.num_rows,
            )
        return {"documents": counts["records"], **counts}


class FilterWork(ShardWork):
    """A filtering stage: every kept input row, with the filters' scores and decision."""

    splittable = True

    def __init__(self, stage: str, make_filters: Callable[[], Sequence[DocumentFilter]]) -> None:
        self.stage = stage
        self.filters = list(make_filters())

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        writer = out.table(self.stage)
        counts: list[dict[str, Any]] = []
        for batch in kept_batches(shard, out):
            decided, stats = run_filters(batch, self.filters)
            writer.write(decided)
            counts.append({**decision_counts(decided), "filters": stats.as_dict()["filters"]})
        return merge_counts(counts)


class SignatureWork(ShardWork):
    """minhash_signatures: the exact hash and MinHash signature of every kept document."""

    splittable = True

    def __init__(self, config: MinHashConfig) -> None:
        self.config = config

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        writer = out.table("minhash_signatures", self.config.signature_schema())
        documents = 0
        for batch in kept_batches(shard, out):
            writer.write(compute_signatures(batch, self.config))
            documents += batch.num_rows
        return {"documents": documents}


class DedupWork(ShardWork):
    """deduplicated: each kept document's cluster, and the cut of every non-survivor. Reads only the
    cluster rows of the shard it processes (`ShardClusters`), in step with the shard's documents; every
    row records the version of that cluster file (`versions`: shard key -> version, as the clustering
    recorded them: `recorded_versions`)."""

    def __init__(self, versions: dict[str, str]) -> None:
        self.versions = versions

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        path = posixpath.join(out.lake.dataset_dir(CLUSTERS_STAGE), cluster_file_name(out.source, shard.key))
        clusters = ShardClusters(path, out.lake.fs, self.versions.get(shard.key, EMPTY_VERSION))
        writer = out.table("deduplicated")
        counts = []
        for batch in kept_batches(shard, out):
            decided = clusters.apply(batch)
            writer.write(decided)
            counts.append(decision_counts(decided))
        clusters.finish()
        return merge_counts(counts)
