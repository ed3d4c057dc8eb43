"""Which documents are held out for evaluation: decided once, before anything is trained on the rest.

Per source, the held-out set is the `count` documents whose ids hash lowest, where

    count = min(max(ceil(heldout_fraction * n), min(heldout_min_documents, n)),
                floor(heldout_max_share * n))                                   (n documents)

so every source is scored on at least `heldout_min_documents` documents (default 50), a figure from one
or two documents would say nothing, but never on more than `heldout_max_share` of them (default half), so
a small source still trains: held out whole, it would get no training tokens and its mixture weight
would move silently to the other sources (issue 20). A source of one document is not held out. The choice
depends only on the source's ids: the same for every seed, rerun and machine, and the tokenizer asset
and the mixture build compute the same split independently.

The split is a cut on the id hash (`heldout_cut`: the largest hash held out), computed once from the
source's ids alone; each shard is then split on its own against that cut, so tokenising shards in
parallel holds out exactly what splitting the whole source would. Ids are unique within a source (the
reader namespaces and de-duplicates them), so the cut holds out exactly `count` documents.

`heldout_max_share: 1.0` restores holding a small source out whole; the mixture's blocking check
`weighted_sources_trained` then stops the run before a source with a weight trains on nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.mixture.sampler import stable_hash

HELDOUT_MAX_SHARE = 0.5  # the default of MixtureConfig.heldout_max_share


def heldout_count(
    num_documents: int, fraction: float, min_documents: int, max_share: float = HELDOUT_MAX_SHARE
) -> int:
    if not 0 <= fraction < 1:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {fraction}")
    if min_documents < 0:
        raise ValueError(f"heldout_min_documents must not be negative, got {min_documents}")
    if not 0 < max_share <= 1:
        raise ValueError(f"heldout_max_share must be in (0, 1], got {max_share}")
    wanted = max(math.ceil(fraction * num_documents), min(min_documents, num_documents))
    return min(wanted, math.floor(max_share * num_documents))


def heldout_cut(
    ids: Iterable[str], fraction: float, min_documents: int, max_share: float = HELDOUT_MAX_SHARE
) -> int | None:
    """The largest id hash held out for a source with these ids (None: nothing is held out)."""
    hashes = np.sort(_hashes(ids))
    count = heldout_count(len(hashes), fraction, min_documents, max_share)
    return int(hashes[count - 1]) if count else None


def lowest_hashes(ids: Iterable[str], count: int) -> np.ndarray:
    """The `count` lowest id hashes of `ids`, sorted: a part of a source's ids gives these, and the
    source's cut is the `count`-th lowest of the parts' together (`cut_of_lowest`)."""
    hashes = _hashes(ids)
    if count < len(hashes):
        hashes = np.partition(hashes, count)[:count] if count else hashes[:0]
    return np.sort(hashes)


def cut_of_lowest(parts: Iterable[np.ndarray], count: int) -> int | None:
    """`heldout_cut` of a source held out `count` documents, from each part's `lowest_hashes(ids, count)`."""
    if not count:
        return None
    return int(np.sort(np.concatenate([np.empty(0, np.uint64), *parts]))[count - 1])


def split_at_cut(table: pa.Table, cut: int | None) -> tuple[pa.Table, pa.Table]:
    """(training, held-out) rows of `table` (column `id`), each in the table's order."""
    held = np.zeros(table.num_rows, dtype=bool) if cut is None else _hashes(table["id"].to_pylist()) <= cut
    mask = pa.array(held)
    return table.filter(pc.invert(mask)), table.filter(mask)


def split_heldout(
    table: pa.Table, fraction: float, min_documents: int, max_share: float = HELDOUT_MAX_SHARE
) -> tuple[pa.Table, pa.Table]:
    """(training, held-out) rows of one source's documents (column `id`), each in the table's order."""
    return split_at_cut(table, heldout_cut(table["id"].to_pylist(), fraction, min_documents, max_share))


def training_documents(
    documents: dict[str, pa.Table], fraction: float, min_documents: int, max_share: float = HELDOUT_MAX_SHARE
) -> dict[str, pa.Table]:
    """Each source's documents minus its held-out ones: all a tokenizer may learn from."""
    return {
        source: split_heldout(table, fraction, min_documents, max_share)[0]
        for source, table in documents.items()
    }


def _hashes(ids: Iterable[str]) -> np.ndarray:
    return np.array([stable_hash(str(doc_id)) for doc_id in ids], dtype=np.uint64)
