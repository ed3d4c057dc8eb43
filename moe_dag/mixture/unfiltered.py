"""The documents of the unfiltered baseline: everything ingested, minus copies of the evaluation set.

The curation's gain is measured by training the same proxy on every ingested document (no filters, no
dedup, no quality heads) and scoring both models on the curated mixture's held-out documents. Raw data
holds copies of those documents under other ids (exact duplicates, near duplicates across sources), and
a baseline trained on them would be scored on text it has seen. So three kinds of documents are removed:
the held-out documents themselves, documents with exactly the same text as one, and documents in the
same dedup cluster as one (MinHash near duplicates; `dedup_clusters` covers what the prefilter kept).

`build_unfiltered_mixture` does this on the lake without reading raw text into the driver: two stages
run per raw shard on the engine (Ray tasks, or a loop with `workers=0`), each with a completion record:

1. `unfiltered_mixture/heldout_texts`: the text hash of every left-out id the shard holds (a few rows);
2. `unfiltered_mixture/shards`: the token shard of the shard's remaining documents (`removal_reasons`).

The driver holds only ids and hashes of the left-out documents and their cluster mates (found by tasks:
the curated held-out file, the exclusions, the clusters and the hashes are read in tasks), and the
token shards' document lengths (read by tasks); it draws the plan as the curated mixture does, to the
curated mixture's token budget, and tasks pack the rows from it.
`unfiltered_documents` is the same rule on tables in memory: the reference the tests compare with.

`dropped` ids are left out too (reason `dropped`): a curation ablation (benchmarks/curation_gain.py)
packs the raw documents minus what every curation stage but one dropped, through this same path, so it
differs from the unfiltered baseline only in those documents.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.curation.dedup.clusters import cluster_mates
from moe_dag.engine import ShardInput, ShardOutput, ShardWork, StageSpec, merge_counts, upstream_inputs
from moe_dag.engine.tasks import map_tasks
from moe_dag.mixture.build import HELDOUT_FILE, HELDOUT_SCHEMA, REPORT_FILE, MixtureConfig, pack_mixture
from moe_dag.mixture.curated import MIXTURE_STAGE, TOKENIZER_STAGE, StageRunner
from moe_dag.mixture.neutral import excluded_ids
from moe_dag.mixture.token_shards import SourceIndex, TokenShardWriter
from moe_dag.mixture.tokenizer import TOKENIZER_FILE, eos_id, load_tokenizer
from moe_dag.storage.lake import Lake, read_batches

RAW_STAGE = "raw_documents"
CLUSTERS_STAGE = "dedup_clusters"
UNFILTERED_STAGE = "unfiltered_mixture"
TEXTS_STAGE = "unfiltered_mixture/heldout_texts"
TOKENS_STAGE = "unfiltered_mixture/shards"
REASONS = ("heldout", "exact_copy", "near_copy")
DROPPED = "dropped"  # left out because the caller says so (an ablation's curation), after REASONS
TEXT_HASH_SCHEMA = pa.schema([("id", pa.string()), ("text_hash", pa.binary(16))])


def _text_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def heldout_text_hashes(table: pa.Table, heldout: pa.Array) -> pa.Table:
    """(id, text_hash) of `table`'s rows whose id is in `heldout` (a string array)."""
    held = table.filter(pc.is_in(table["id"], value_set=heldout))
    hashes = pa.array([_text_hash(text) for text in held["text"].to_pylist()], pa.binary(16))
    return pa.table({"id": held["id"].cast(pa.string()), "text_hash": hashes}, TEXT_HASH_SCHEMA)


def near_copy_ids(cluster_batches: Callable[[], Iterator[pa.Table]], heldout: pa.Array) -> set[str]:
    """Ids in a dedup cluster with a held-out document, from two streamed passes over (id, cluster_id)."""
    clusters = pc.unique(
        pa.chunked_array(
            [
                batch.filter(pc.is_in(batch["id"], value_set=heldout))["cluster_id"]
                for batch in cluster_batches()
            ],
            pa.string(),
        )
    )
    return {
        doc_id
        for batch in cluster_batches()
        for doc_id in batch.filter(pc.is_in(batch["cluster_id"], value_set=clusters))["id"].to_pylist()
    }


def removal_reasons(
    table: pa.Table,
    heldout_ids: frozenset[str],
    heldout_texts: frozenset[bytes],
    near_copies: frozenset[str],
    dropped: frozenset[str] = frozenset(),
) -> list[str | None]:
    """Why each row of `table` (`id`, `text`) is left out (one of REASONS, or DROPPED), or None to keep it."""

    def reason(doc_id: str, text: str) -> str | None:
        if doc_id in heldout_ids:
            return "heldout"
        if _text_hash(text) in heldout_texts:
            return "exact_copy"
        if doc_id in near_copies:
            return "near_copy"
        return DROPPED if doc_id in dropped else None

    return [
        reason(doc_id, text)
        for doc_id, text in zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True)
    ]


def unfiltered_documents(
    raw: dict[str, pa.Table], heldout_ids: set[str], clusters: pa.Table | None
) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """Each source's raw documents (columns `id`, `text`) without the held-out documents and their exact
    and near copies; also how many documents each rule removed."""
    heldout = _string_set(heldout_ids)
    texts = frozenset(
        hash_
        for table in raw.values()
        for hash_ in heldout_text_hashes(table, heldout)["text_hash"].to_pylist()
    )
    near = near_copy_ids(lambda: iter([clusters]), heldout) if clusters is not None else set()
    removed = dict.fromkeys(REASONS, 0)
    kept: dict[str, pa.Table] = {}
    for source, table in raw.items():
        reasons = removal_reasons(table, frozenset(heldout_ids), texts, frozenset(near))
        for reason in filter(None, reasons):
            removed[reason] += 1
        kept[source] = table.select(["id", "text"]).filter(pa.array([r is None for r in reasons], pa.bool_()))
    return kept, removed


class HeldoutTextWork(ShardWork):
    """unfiltered_mixture/heldout_texts: the text hashes of the left-out documents in one raw shard."""

    def __init__(self, heldout_ids: frozenset[str]) -> None:
        self.heldout = _string_set(heldout_ids)

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        writer = out.table(TEXTS_STAGE, TEXT_HASH_SCHEMA)
        documents = 0
        for batch in read_batches(shard.path, out.lake.fs, columns=["id", "text"]):
            writer.write(heldout_text_hashes(batch, self.heldout))
            documents += batch.num_rows
        return {"documents": documents}


class UnfilteredTokenizeWork(ShardWork):
    """unfiltered_mixture/shards: one raw shard's documents, the left-out ones removed, as a token shard."""

    def __init__(
        self,
        tokenizer_path: str | os.PathLike[str],  # a LakeArtifact on an object-store lake
        eos_token: str,
        heldout_ids: frozenset[str],
        heldout_texts: frozenset[bytes],
        near_copies: frozenset[str],
        dropped: frozenset[str] = frozenset(),
    ) -> None:
        self.tokenizer = load_tokenizer(Path(tokenizer_path))
        self.eos = eos_id(self.tokenizer, eos_token)
        self.rules = (heldout_ids, heldout_texts, near_copies, dropped)

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        writer = TokenShardWriter(
            self.tokenizer,
            self.eos,
            out.local_path(TOKENS_STAGE, ".bin"),
            out.local_path(TOKENS_STAGE, ".index.parquet"),
        )
        removed = dict.fromkeys(REASONS, 0)  # DROPPED only where an ablation drops any
        documents = 0
        with writer:
            for batch in read_batches(shard.path, out.lake.fs, columns=["id", "text"]):
                reasons = removal_reasons(batch, *self.rules)
                for reason in filter(None, reasons):
                    removed[reason] = removed.get(reason, 0) + 1
                writer.write(batch.filter(pa.array([r is None for r in reasons], pa.bool_())))
                documents += batch.num_rows
        return {"documents": documents, "tokens": writer.tokens, "removed": removed}


@dataclass(frozen=True)
class UnfilteredMixture:
    report: dict  # mixture.json
    out_dir: Path
    documents: int  # documents left to sample from
    removed: dict[str, int]  # documents left out, by reason


def build_unfiltered_mixture(
    lake: Lake,
    sources: list[str],
    config: MixtureConfig,
    run: StageRunner,
    dropped: frozenset[str] = frozenset(),
) -> UnfilteredMixture:
    """Every ingested document, the curated held-out set, the neutral set and their copies left out (and
    the `dropped` ids), packed with the curated mixture's recipe and token budget into the lake's
    `unfiltered_mixture` folder."""
    curated_dir = lake.artifact_dir(MIXTURE_STAGE)
    curated = json.loads((curated_dir / REPORT_FILE).read_text())
    # Ids of the evaluation sets (the curated held-out set, the neutral set and its copies) and their
    # cluster mates, found by tasks: this process holds those ids, never a source's rows.
    heldout_ids = map_tasks(
        functools.partial(_left_out_ids, lake.url), [curated_dir / HELDOUT_FILE], this_node=True
    )[0]
    near = frozenset()
    if heldout_ids and lake.has_table(CLUSTERS_STAGE):
        clusters = lake.glob_pattern(CLUSTERS_STAGE, partitioned=False)
        near = frozenset(map_tasks(functools.partial(cluster_mates, clusters), [sorted(heldout_ids)])[0])
    texts_spec = StageSpec(
        outputs=(TEXTS_STAGE,),
        make_work=functools.partial(HeldoutTextWork, heldout_ids),
        params=_digest(sorted(heldout_ids)),
    )
    for name in sorted(sources):
        run(texts_spec, name, upstream_inputs(lake, RAW_STAGE, name))
    heldout_texts = frozenset().union(*map_tasks(functools.partial(_text_hashes, lake.url), sorted(sources)))

    tokenizer = load_tokenizer(lake.artifact_dir(TOKENIZER_STAGE) / TOKENIZER_FILE)
    rules = (heldout_ids, heldout_texts, near, dropped)
    tokens_spec = StageSpec(
        outputs=(TOKENS_STAGE,),
        make_work=functools.partial(
            UnfilteredTokenizeWork, lake.artifact(TOKENIZER_STAGE, TOKENIZER_FILE), config.eos_token, *rules
        ),
        # A retrained tokenizer, or another set left out, retokenises every shard.
        params=_digest(tokenizer.to_str(), config.eos_token, *(sorted(rule) for rule in rules)),
        # One tokenizer per worker process, as tokenize_curated's: each tokenizer loaded and used leaves
        # a few MB its drop does not give back (tokenizers 0.23: ~7 MB a shard of the demo corpus), so a
        # fresh one per shard grew a worker with the shards it ran; warm, its word cache also stays warm.
        warm=True,
    )
    keys, counts = {}, []
    for name in sorted(sources):
        stage_run = run(tokens_spec, name, upstream_inputs(lake, RAW_STAGE, name))
        keys[name] = list(stage_run.records)
        counts.append(stage_run.counts)
    shards = SourceIndex.gather(lake, TOKENS_STAGE, keys)

    # Scored on the curated held-out set only: this mixture keeps nothing back of its own.
    recipe = dataclasses.replace(
        config, total_tokens=curated["total_tokens"], heldout_fraction=0.0, heldout_min_documents=0
    )
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    eos = eos_id(tokenizer, config.eos_token)
    with lake.writing_artifact(UNFILTERED_STAGE) as out_dir:
        report = pack_mixture(shards, HELDOUT_SCHEMA.empty_table(), vocab_size, eos, recipe, out_dir)
    removed = dict.fromkeys(REASONS, 0) | merge_counts(counts).get("removed", {})
    return UnfilteredMixture(report, out_dir, sum(len(tokens) for tokens in shards.values()), removed)


def _left_out_ids(lake_url: str, curated_heldout: Path) -> frozenset[str]:
    """The curated held-out ids (from the curated mixture's file), the neutral set and its copies."""
    held = pq.read_table(curated_heldout, columns=["id"])["id"].to_pylist()
    return frozenset(held) | excluded_ids(Lake(lake_url))


def _text_hashes(lake_url: str, source: str) -> frozenset[bytes]:
    return frozenset(
        Lake(lake_url).read_table(TEXTS_STAGE, source, columns=["text_hash"])["text_hash"].to_pylist()
    )


def _string_set(ids: Iterable[str]) -> pa.Array:
    return pa.array(sorted(ids), pa.string())


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()
