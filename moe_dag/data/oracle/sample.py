"""The documents sent to the oracle: a stratified sample per source.

Within a source, documents are ranked by length and cut into equal-count buckets (length quantiles);
each bucket gets its proportional share of the sample (largest remainders round), drawn at random. Every
length range of the source is therefore represented as it occurs, with less variance than one random
draw, which matters twice: the heads see short and long documents alike, and the thresholds calibrated
on the held-out part of this sample hit keep rates that hold on the whole source.

Deterministic for a seed, and independent of row order (ties in length are broken by document id), so a
rerun over the same documents read in a different shard order labels the same sample.

`split_sample` draws, from one source's documents, the sample to label and, from the rest, the
calibration sample that thresholds are set on (scored by the heads, never labelled).
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _largest_remainder(total: int, sizes: list[int]) -> list[int]:
    """Split `total` over groups in proportion to `sizes`, rounding by largest remainders."""
    exact = [total * size / sum(sizes) for size in sizes]
    quotas = [int(x) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - quotas[i]), i))
    for i in by_remainder[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


def stratified_sample(table: pa.Table, per_source: int, seed: int, *, length_buckets: int = 4) -> pa.Table:
    """Up to `per_source` rows of each source (all of them when it has fewer), in input order."""
    if per_source < 1:
        raise ValueError(f"per_source must be >= 1, got {per_source}")
    if length_buckets < 1:
        raise ValueError(f"length_buckets must be >= 1, got {length_buckets}")
    sources = np.asarray(table["source"].to_pylist(), dtype=object)
    ids = np.asarray(table["id"].to_pylist(), dtype=object)
    lengths = pc.utf8_length(table["text"]).to_numpy(zero_copy_only=False)

    chosen = []
    for source in sorted(set(sources)):
        rows = np.flatnonzero(sources == source)
        if len(rows) <= per_source:
            chosen.append(rows)
            continue
        ranked = rows[np.lexsort((ids[rows], lengths[rows]))]
        buckets = np.array_split(ranked, min(length_buckets, per_source))
        rng = np.random.default_rng([seed, zlib.crc32(source.encode())])
        quotas = _largest_remainder(per_source, [len(b) for b in buckets])
        chosen.extend(rng.choice(b, q, replace=False) for b, q in zip(buckets, quotas, strict=True))
    return table.take(np.sort(np.concatenate(chosen)) if chosen else np.array([], dtype=np.int64))


def split_sample(
    documents: pa.Table, labelled: int, calibration: int, seed: int
) -> tuple[pa.Table, pa.Table]:
    """(documents to label, disjoint documents to calibrate on), each stratified by length per source."""
    to_label = stratified_sample(documents, per_source=labelled, seed=seed)
    rest = documents.filter(pc.invert(pc.is_in(documents["id"], value_set=to_label["id"].combine_chunks())))
    if calibration < 1 or rest.num_rows == 0:
        return to_label, rest.slice(0, 0)
    return to_label, stratified_sample(rest, per_source=calibration, seed=seed + 1)
