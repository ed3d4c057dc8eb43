"""The shard work of each per-source stage: plain library calls over a shard's Arrow batches.

Each class is built once per worker (in an actor for those that hold a model) and then processes
shards: it streams the input shard in batches, calls the stage's library function on each batch, and
writes each result batch to the shard's output file. The library functions (`read_shard_batches`,
`run_filters`, `compute_signatures`, `ShardClusters.apply`, `score_documents`, the token shard writer) know
nothing of shards or Ray.

Counts returned per shard: `documents` (rows the stage received), and for stages that decide, `kept`,
`dropped` and `reasons` (dropped rows per reason code); they add up over shards into the stage's
reconciliation.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.data.dedup import SIGNATURE_SCHEMA, MinHashConfig, ShardClusters, compute_signatures
from moe_dag.data.dedup.clusters import EMPTY_VERSION
from moe_dag.data.dedup.partitioned import CLUSTERS_STAGE, cluster_file_name
from moe_dag.data.engine.blocks import BlockSizes, read_rows
from moe_dag.data.engine.shards import ShardInput
from moe_dag.data.engine.stage import ShardOutput, ShardWork, merge_counts
from moe_dag.data.filters import DocumentFilter, run_filters
from moe_dag.data.lake import BATCH_ROWS, Lake, read_batches
from moe_dag.data.mixture.build import HELDOUT_SCHEMA, heldout_table
from moe_dag.data.mixture.heldout import split_at_cut
from moe_dag.data.mixture.neutral import Exclusions, without_excluded
from moe_dag.data.mixture.token_shards import TokenShardWriter
from moe_dag.data.readers import joined_read, read_block_batches, read_shard_batches, shard_spans
from moe_dag.data.schema import DOCUMENT_SCHEMA, QUARANTINE_SCHEMA, kept_rows, reason_counts
from moe_dag.data.tokenizer import eos_id, load_tokenizer


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
        writer = out.table("minhash_signatures", SIGNATURE_SCHEMA)
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


class ScoringWork(ShardWork):
    """scored_documents: the probe, then the judge for documents the probe lets through. Holds the
    backbone and the heads, so it runs in an actor pool (one GPU per actor in production).

    Rows of the shard's previous output that the current heads already scored are reused and only
    decided again (new thresholds do not need the backbone); the rest are scored.

    Splittable: a block's batches are the whole shard's batches over the same rows (blocks.py), so
    the backbone sees the same padded batches and gives the same scores."""

    splittable = True

    def __init__(self, heads_dir: str | os.PathLike[str], source: str) -> None:
        from moe_dag.data.heads import load_heads

        self.stored = load_heads(heads_dir)
        self.thresholds = self.stored.thresholds[source]

    @property
    def backbone(self) -> Any:
        # torch and transformers load only in the processes that score, and only when a row needs it;
        # not kept here, so a work kept by its process (warm.py) holds no backbone but the current one.
        return shared_backbone(self.stored.backbone_config)

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        from moe_dag.data.scoring import early_exit_summary, score_documents, split_reusable

        previous_path = out.lake.shard_path("scored_documents", out.source, shard.key)
        previous = out.lake.read_file(previous_path) if out.lake.fs.exists(previous_path) else None
        writer = out.table("scored_documents")
        counts = []
        batch_size = self.stored.backbone_config.batch_size
        for batch in kept_batches(shard, out):
            reused, todo = split_reusable(batch, previous, self.stored.version, self.thresholds)
            parts = [] if reused is None else [reused]
            if todo.num_rows:
                parts.append(
                    score_documents(todo, self.backbone, self.stored.heads, self.thresholds, batch_size)
                )
            if not parts:
                continue
            scored = pa.concat_tables(parts, promote_options="permissive")
            writer.write(scored)
            exits = early_exit_summary(scored, self.stored.backbone_config)
            counts.append(
                {
                    **decision_counts(scored),
                    # Rates weighted by documents, so they add up over batches and shards.
                    "early_exits": round(exits["early_exit_rate"] * scored.num_rows),
                    "kept_at_probe": round(exits["keep_exit_rate"] * scored.num_rows),
                    "layer_compute_saved": exits["layer_compute_saved"] * scored.num_rows,
                }
            )
        return merge_counts(counts)


_BACKBONE: dict[str, Any] = {}


def shared_backbone(config: Any) -> Any:
    """The backbone of `config` (a `BackboneConfig`), loaded once per process: the scoring works of
    every source (one per source, for its thresholds) share it. One is kept, the last asked for."""
    key = repr(config)
    if key not in _BACKBONE:
        from moe_dag.data.heads import load_backbone

        _BACKBONE.clear()  # before loading, so that two are never held at once
        _BACKBONE[key] = load_backbone(config)
    return _BACKBONE[key]


class TokenizeWork(ShardWork):
    """Token shards of the kept scored documents: `<key>.bin` + `<key>.index.parquet` under
    `tokens_stage` for training, `<key>.parquet` under `heldout_stage` for evaluation. Each source's
    held-out cut (see heldout.py) is computed once from its ids, so the split is the same whatever the
    shards."""

    def __init__(
        self,
        tokens_stage: str,
        heldout_stage: str,
        tokenizer_path: str | os.PathLike[str],  # a LakeArtifact on an object-store lake
        eos_token: str,
        heldout_cuts: dict[str, int | None],
        # The neutral set and its copies (neutral.py): read by the worker from the lake, once a process.
        excluded_ids: Exclusions | frozenset[str] = frozenset(),
    ) -> None:
        self.tokens_stage, self.heldout_stage = tokens_stage, heldout_stage
        self.tokenizer = load_tokenizer(Path(tokenizer_path))
        self.eos = eos_id(self.tokenizer, eos_token)
        self.heldout_cuts = heldout_cuts
        self.excluded_ids = excluded_ids

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        token_writer = TokenShardWriter(
            self.tokenizer,
            self.eos,
            out.local_path(self.tokens_stage, ".bin"),
            out.local_path(self.tokens_stage, ".index.parquet"),
        )
        heldout = out.table(self.heldout_stage, HELDOUT_SCHEMA)
        documents = held = 0
        with token_writer:
            for batch in kept_batches(shard, out):
                usable = without_excluded(batch, self.excluded_ids)
                train, held_rows = split_at_cut(usable, self.heldout_cuts[out.source])
                token_writer.write(train)
                heldout.write(heldout_table(held_rows, self.tokenizer, self.eos, out.source))
                documents += batch.num_rows
                held += held_rows.num_rows
        return {"documents": documents, "heldout": held, "tokens": token_writer.tokens}
