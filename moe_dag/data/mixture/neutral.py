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

User sets are jsonl or parquet files in the raw shard format (moe_dag/data/readers.py), named in the
config; they are scored, never excluded from training (a user set is the user's to keep apart).

The tokenised sets are written one folder each in the layout the trainer's evaluation reads
(`heldout.parquet` and a `mixture.json` naming the tokenizer's vocabulary), so `--eval-on` takes them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from moe_dag.data.atomic import atomic_path
from moe_dag.data.lake import Lake
from moe_dag.data.mixture.build import HELDOUT_FILE, HELDOUT_SCHEMA, REPORT_FILE, heldout_table
from moe_dag.data.mixture.sampler import stable_hash
from moe_dag.data.readers import read_shard

NEUTRAL_SET = "neutral"
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
    user_sets: dict[str, str] = field(default_factory=dict)

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
    `ids` (dedup's clusters; None before there are any), so only the sample's clusters are read."""
    neutral = [DOCUMENTS_SCHEMA.empty_table()]
    for source in sources:
        for batch in raw_batches(source):
            chosen = batch.filter(is_neutral(batch["id"], share))
            columns = {"source": [source] * chosen.num_rows, "id": chosen["id"], "text": chosen["text"]}
            neutral.append(pa.table(columns, DOCUMENTS_SCHEMA))
    documents = pa.concat_tables(neutral)
    neutral_ids = set(documents["id"].to_pylist())
    texts = {_text_hash(text) for text in documents["text"].to_pylist()}
    near = set(cluster_mates(sorted(neutral_ids))) if cluster_mates is not None and neutral_ids else set()
    rows = []
    for source in sources:
        for batch in raw_batches(source):
            for doc_id, text in zip(batch["id"].to_pylist(), batch["text"].to_pylist(), strict=True):
                if doc_id in neutral_ids:
                    rows.append((source, doc_id, "neutral"))
                elif _text_hash(text) in texts:
                    rows.append((source, doc_id, "exact_copy"))
                elif doc_id in near:
                    rows.append((source, doc_id, "near_copy"))
    exclusions = pa.table(
        {name: [row[i] for row in rows] for i, name in enumerate(EXCLUSION_SCHEMA.names)}, EXCLUSION_SCHEMA
    )
    return documents, exclusions


def without_excluded(table: pa.Table, excluded: frozenset[str] | set[str]) -> pa.Table:
    """`table`'s rows whose `id` is not excluded."""
    if not excluded:
        return table
    return table.filter(pc.invert(pc.is_in(table["id"], pa.array(sorted(excluded), pa.string()))))


def excluded_ids(lake: Lake) -> frozenset[str]:
    """Ids no training may see (empty before `neutral_documents` has run, or with no neutral set)."""
    if not lake.has_table(EXCLUSIONS_STAGE):
        return frozenset()
    return frozenset(lake.read_table(EXCLUSIONS_STAGE, columns=["id"])["id"].to_pylist())


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
