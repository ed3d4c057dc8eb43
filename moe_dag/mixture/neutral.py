"""Evaluation sets fixed before any filter runs: the neutral set, and the user's own sets.

The curated held-out documents (heldout.py) are drawn from what the filters kept, so they favour the
curated mixture by construction: a filter that drops a kind of text also drops it from the test. The
neutral set is drawn from the raw documents instead, by id hash:

    a raw document is neutral  <=>  hash("neutral/" + id) < neutral_share * 2**64

salted apart from the held-out hash so the two samples are independent. A document's membership depends
on its own id alone: the same whatever the filters, thresholds or heads decide, the same on every rerun,
and the same when shards arrive: a new shard brings its own members (about `neutral_share` of it) and
moves no old document into or out of the set. (A count per source, the lowest N hashes, would let a
new document with a low hash push an old one out.)

Nothing trained may have seen it: every neutral document, every document with exactly its text and
every document in a dedup cluster with one (a near copy, possibly the survivor kept in another source)
is excluded from the tokenizer's training text, from the curated mixture, from the unfiltered baseline
and from every mixture the search packs (`evaluation_exclusions`).

User sets are jsonl or parquet files in the raw shard format (moe_dag/storage/readers.py), named in the
config; they are scored, never excluded from training (a user set is the user's to keep apart).

The tokenised sets are written one folder each in the layout the trainer's evaluation reads
(`heldout.parquet` and a `mixture.json` naming the tokenizer's vocabulary), so `--eval-on` takes them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from moe_dag.curation.dedup.clusters import cluster_mates
from moe_dag.engine.tasks import map_tasks
from moe_dag.mixture.build import HELDOUT_FILE, HELDOUT_SCHEMA, REPORT_FILE, heldout_table
from moe_dag.mixture.sampler import stable_hash
from moe_dag.storage.atomic import atomic_path
from moe_dag.storage.lake import Lake, read_batches
from moe_dag.storage.readers import read_shard
from moe_dag.training.strict_config import NON_EMPTY

NEUTRAL_SET = "neutral"
NEUTRAL_STAGE = "neutral_documents"  # the lake table of the neutral documents (source, id, text)
RAW_STAGE = "raw_documents"
DIGEST_KEY = b"moe_dag.ids_digest"  # schema metadata of the exclusions table: `ids_digest` of the set
NEUTRAL_SALT = "neutral/"
EXCLUSIONS_STAGE = "evaluation_exclusions"  # the lake table of ids no training may see
EXCLUSION_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),  # neutral, exact_copy or near_copy
    ]
)
DOCUMENTS_SCHEMA = pa.schema([("source", pa.string()), ("id", pa.string()), ("text", pa.string())])


NEUTRAL_SHARE = 0.05


@dataclass(kw_only=True)
class EvaluationConfig:
    # The share of each source's raw documents in the neutral set (by id hash, so a small source gives
    # it as small a share as a large one); 0 turns it off.
    neutral_share: float = NEUTRAL_SHARE
    # Name -> path of a jsonl or parquet file in the raw shard format, scored beside the neutral set.
    user_sets: dict[str, Annotated[str, NON_EMPTY]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.neutral_share < 1:
            raise ValueError(f"neutral_share must be in [0, 1), got {self.neutral_share}")
        for name in self.user_sets:
            if name == NEUTRAL_SET or not name.replace("_", "").isalnum():
                raise ValueError(
                    f"user_sets: {name!r} must be letters, digits and underscores, and not {NEUTRAL_SET!r}"
                )


def neutral_hashes(ids: Iterable[str]) -> np.ndarray:
    return np.array([stable_hash(NEUTRAL_SALT + str(doc_id)) for doc_id in ids], dtype=np.uint64)


def is_neutral(ids: pa.Array | pa.ChunkedArray, share: float) -> pa.Array:
    """Whether each id is in the neutral set: its salted hash is in the lowest `share` of the range."""
    cut = np.uint64(min(int(share * 2**64), 2**64 - 1))
    return pa.array(neutral_hashes(ids.to_pylist()) < cut, pa.bool_())


def _text_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def select_neutral(
    sources: list[str],
    raw_batches: Callable[[str], Iterator[pa.Table]],
    share: float,
    cluster_mates: Callable[[list[str]], Iterable[str]] | None = None,
) -> tuple[pa.Table, pa.Table]:
    """(neutral documents: source, id, text; exclusions: EXCLUSION_SCHEMA) from the raw documents.

    `raw_batches(source)` streams a source's raw documents (columns id, text) and is read twice: the
    sample, then the copies. `cluster_mates(ids)` gives the ids that share a dedup cluster with any of
    `ids` (dedup's clusters; None before there are any), so only the sample's clusters are read. The
    reference `select_neutral_in_tasks` is held to."""
    documents = pa.concat_tables(
        [DOCUMENTS_SCHEMA.empty_table()]
        + [neutral_rows(batch, source, share) for source in sources for batch in raw_batches(source)]
    )
    neutral_ids = frozenset(documents["id"].to_pylist())
    texts = frozenset(map(_text_hash, documents["text"].to_pylist()))
    near = (
        frozenset(cluster_mates(sorted(neutral_ids)))
        if cluster_mates is not None and neutral_ids
        else frozenset()
    )
    exclusions = pa.concat_tables(
        [EXCLUSION_SCHEMA.empty_table()]
        + [
            exclusion_rows(batch, source, neutral_ids, texts, near)
            for source in sources
            for batch in raw_batches(source)
        ]
    )
    return documents, exclusions


def neutral_rows(batch: pa.Table, source: str, share: float) -> pa.Table:
    """The neutral documents of one batch of a source's raw documents (id, text), as DOCUMENTS_SCHEMA."""
    chosen = batch.filter(is_neutral(batch["id"], share))
    columns = {"source": [source] * chosen.num_rows, "id": chosen["id"], "text": chosen["text"]}
    return pa.table(columns, DOCUMENTS_SCHEMA)


def exclusion_rows(
    batch: pa.Table, source: str, neutral_ids: frozenset[str], texts: frozenset[bytes], near: frozenset[str]
) -> pa.Table:
    """The rows of one batch (id, text) training must leave out, with why (EXCLUSION_SCHEMA)."""
    rows = []
    for doc_id, text in zip(batch["id"].to_pylist(), batch["text"].to_pylist(), strict=True):
        if doc_id in neutral_ids:
            rows.append((source, doc_id, "neutral"))
        elif _text_hash(text) in texts:
            rows.append((source, doc_id, "exact_copy"))
        elif doc_id in near:
            rows.append((source, doc_id, "near_copy"))
    return pa.table(
        {name: [row[i] for row in rows] for i, name in enumerate(EXCLUSION_SCHEMA.names)}, EXCLUSION_SCHEMA
    )


@dataclass(frozen=True)
class NeutralSelection:
    per_source: dict[str, int]  # neutral documents drawn per source
    exclusions: pa.Table  # EXCLUSION_SCHEMA: ids and reasons, no text
    digest: str  # of the sample's and the exclusions' ids: what trains changes only when it does


def select_neutral_in_tasks(
    lake: Lake, sources: list[str], share: float, clusters: str | None, stage: str = NEUTRAL_STAGE
) -> NeutralSelection:
    """`select_neutral` over the lake's raw documents, the raw text read only in tasks (`map_tasks`): each
    raw file's task writes its neutral documents to `stage` (one file per raw file) and returns their ids
    and text hashes; the cluster mates of the sample are found in a task; a second pass of tasks returns
    each file's exclusions. This process holds ids and hashes of the sample and its copies, never a source.
    `clusters`: the dedup clusters' files (a glob), None before there are any."""
    files = [(source, path) for source in sources for path in lake.parquet_files(RAW_STAGE, source)]
    names = [f"{source}-{posixpath.basename(path)}" for source, path in files]
    drawn = map_tasks(
        functools.partial(_draw_file, lake.url, share, lake.dataset_dir(stage)),
        list(zip(files, names, strict=True)),
    )
    for stale in set(map(posixpath.basename, lake.parquet_files(stage))) - set(names):
        lake.fs.rm(posixpath.join(lake.dataset_dir(stage), stale))
    sample = pa.concat_tables([NEUTRAL_HASH_SCHEMA.empty_table(), *drawn])
    neutral_ids = frozenset(sample["id"].to_pylist())
    texts = frozenset(sample["text_hash"].to_pylist())
    near = frozenset()
    if clusters is not None and neutral_ids:
        near = frozenset(map_tasks(functools.partial(cluster_mates, clusters), [sorted(neutral_ids)])[0])
    excluded = map_tasks(functools.partial(_exclusions_of_file, lake.url, neutral_ids, texts, near), files)
    exclusions = pa.concat_tables([EXCLUSION_SCHEMA.empty_table(), *excluded])
    per_source = Counter(sample["source"].to_pylist())
    return NeutralSelection(
        per_source={source: per_source[source] for source in sources if per_source[source]},
        exclusions=exclusions,
        digest=ids_digest(sample["id"], exclusions["id"]),
    )


def ids_digest(*columns: pa.ChunkedArray | pa.Array) -> str:
    """A digest of sets of ids, whatever their order."""
    content = hashlib.blake2b(digest_size=12)
    for ids in columns:
        content.update("\0".join(sorted(ids.to_pylist())).encode() + b"\1")
    return content.hexdigest()


NEUTRAL_HASH_SCHEMA = pa.schema([("source", pa.string()), ("id", pa.string()), ("text_hash", pa.binary(16))])


def _draw_file(lake_url: str, share: float, folder: str, item: tuple[tuple[str, str], str]) -> pa.Table:
    """A raw file's neutral documents written to `folder` (as `name`); returns their ids and text hashes."""
    (source, path), name = item
    lake = Lake(lake_url)
    chosen = pa.concat_tables(
        [DOCUMENTS_SCHEMA.empty_table()]
        + [neutral_rows(batch, source, share) for batch in read_batches(path, lake.fs, ["id", "text"])]
    )
    lake.write_file(chosen, posixpath.join(folder, name))
    hashes = pa.array(map(_text_hash, chosen["text"].to_pylist()), pa.binary(16))
    return pa.table(
        {"source": chosen["source"], "id": chosen["id"], "text_hash": hashes}, NEUTRAL_HASH_SCHEMA
    )


def _exclusions_of_file(
    lake_url: str,
    neutral_ids: frozenset[str],
    texts: frozenset[bytes],
    near: frozenset[str],
    file: tuple[str, str],
) -> pa.Table:
    source, path = file
    batches = read_batches(path, Lake(lake_url).fs, ["id", "text"])
    return pa.concat_tables(
        [EXCLUSION_SCHEMA.empty_table()]
        + [exclusion_rows(batch, source, neutral_ids, texts, near) for batch in batches]
    )


def without_excluded(table: pa.Table, excluded: Exclusions | frozenset[str] | set[str]) -> pa.Table:
    """`table`'s rows whose `id` is not excluded."""
    if isinstance(excluded, Exclusions):
        excluded = excluded.ids()
    if not excluded:
        return table
    return table.filter(pc.invert(pc.is_in(table["id"], pa.array(sorted(excluded), pa.string()))))


def excluded_ids(lake: Lake) -> frozenset[str]:
    """Ids no training may see (empty before `neutral_documents` has run, or with no neutral set)."""
    if not lake.has_table(EXCLUSIONS_STAGE):
        return frozenset()
    return frozenset(lake.read_table(EXCLUSIONS_STAGE, columns=["id"])["id"].to_pylist())


@dataclass(frozen=True)
class Exclusions:
    """The ids no training may see, named by lake rather than held: a Ray task or actor that filters by
    them reads them itself (once per process and version), so the Dagster process that hands this on
    never reads them. `digest` names their content, for a stage's parameters."""

    lake_url: str

    def ids(self) -> frozenset[str]:
        lake = Lake(self.lake_url)
        return _read_exclusions(self.lake_url, lake.fingerprint(EXCLUSIONS_STAGE))

    def digest(self) -> str:
        """The digest `neutral_documents` stored with the table (its files' names, sizes and times when
        a table written before it did is all there is); reads no row."""
        lake = Lake(self.lake_url)
        for path in lake.parquet_files(EXCLUSIONS_STAGE):
            with lake.fs.open(path, "rb") as handle:
                stored = (pq.read_schema(handle).metadata or {}).get(DIGEST_KEY)
            if stored is not None:
                return stored.decode()
        return lake.fingerprint(EXCLUSIONS_STAGE)


@functools.lru_cache(maxsize=4)
def _read_exclusions(lake_url: str, fingerprint: str) -> frozenset[str]:
    return excluded_ids(Lake(lake_url))


def write_exclusions(lake: Lake, exclusions: pa.Table, digest: str) -> None:
    """The exclusions as the lake's EXCLUSIONS_STAGE table, with their digest (`Exclusions.digest`)."""
    lake.write_table(exclusions.replace_schema_metadata({DIGEST_KEY: digest}), EXCLUSIONS_STAGE)


def read_user_set(name: str, path: str) -> pa.Table:
    """A user's evaluation set (source = its name, id, text); any unreadable line is an error naming the
    file and line, since a set scored without some of its documents would mislead quietly."""
    result = read_shard(path, name)
    if result.quarantine.num_rows:
        first = result.quarantine.slice(0, 1).to_pylist()[0]
        raise ValueError(
            f"evaluation set {name!r}: {first['shard']} line {first['line']}: {first['error']} "
            f"({result.quarantine.num_rows} bad lines in all)"
        )
    if not result.documents.num_rows:
        raise ValueError(f"evaluation set {name!r}: {path} holds no documents")
    documents = result.documents
    return pa.table({"source": documents["source"], "id": documents["id"], "text": documents["text"]})


def write_evaluation_set(
    documents: pa.Table, tokenizer: Tokenizer, eos: int, seq_len: int, out_dir: Path
) -> pa.Table:
    """Tokenise one set (columns source, id, text) into `out_dir` in the layout `--eval-on` reads;
    returns the held-out table written (HELDOUT_SCHEMA)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [
        heldout_table(documents.filter(pc.equal(documents["source"], source)), tokenizer, eos, source)
        for source in sorted(set(documents["source"].to_pylist()))
    ]
    table = pa.concat_tables([HELDOUT_SCHEMA.empty_table(), *parts])
    with atomic_path(out_dir / HELDOUT_FILE) as partial:
        pq.write_table(table, partial)
    report = {
        "seq_len": seq_len,
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "eos_id": eos,
        "num_sequences": 0,  # an evaluation set: nothing to train on
        "documents": table.num_rows,
    }
    with atomic_path(out_dir / REPORT_FILE) as partial:
        partial.write_text(json.dumps(report, indent=2) + "\n")
    return table
