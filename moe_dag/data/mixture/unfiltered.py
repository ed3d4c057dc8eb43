"""The documents of the unfiltered baseline: everything ingested, minus copies of the evaluation set.

The curation's gain is measured by training the same proxy on every ingested document (no filters, no
dedup, no quality heads) and scoring both models on the curated mixture's held-out documents. Raw data
holds copies of those documents under other ids (exact duplicates, near duplicates across sources), and
a baseline trained on them would be scored on text it has seen. So three kinds of documents are removed:
the held-out documents themselves, documents with exactly the same text as one, and documents in the
same dedup cluster as one (MinHash near duplicates; `dedup_clusters` covers what the prefilter kept).
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc


def _text_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def unfiltered_documents(
    raw: dict[str, pa.Table], heldout_ids: set[str], clusters: pa.Table | None
) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """Each source's raw documents (columns `id`, `text`) without the held-out documents and their exact
    and near copies; also how many documents each rule removed."""
    heldout_texts = {
        _text_hash(text)
        for table in raw.values()
        for doc_id, text in zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True)
        if doc_id in heldout_ids
    }
    near_copies: set[str] = set()
    if clusters is not None:
        held_clusters = pc.is_in(clusters["id"], pa.array(sorted(heldout_ids), pa.string()))
        cluster_ids = pc.unique(clusters.filter(held_clusters)["cluster_id"])
        near_copies = set(clusters.filter(pc.is_in(clusters["cluster_id"], cluster_ids))["id"].to_pylist())

    def removal_reason(doc_id: str, text: str) -> str | None:
        if doc_id in heldout_ids:
            return "heldout"
        if _text_hash(text) in heldout_texts:
            return "exact_copy"
        return "near_copy" if doc_id in near_copies else None

    removed = {"heldout": 0, "exact_copy": 0, "near_copy": 0}
    kept: dict[str, pa.Table] = {}
    for source, table in raw.items():
        reasons = [
            removal_reason(doc_id, text)
            for doc_id, text in zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True)
        ]
        for reason in filter(None, reasons):
            removed[reason] += 1
        keep = pa.array([reason is None for reason in reasons], pa.bool_())
        kept[source] = table.select(["id", "text"]).filter(keep)
    return kept, removed
