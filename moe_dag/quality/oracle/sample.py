"""The documents sent to the oracle: a stratified sample per source, drawn where the data is.

Within a source, documents are cut into length buckets (length quantiles: a document's bucket is the
share of the source's documents strictly shorter than it, times the number of buckets, so documents of
one length share a bucket); each bucket gets its proportional share of the sample (largest remainders
round), and within a bucket the documents with the smallest sample keys are drawn. A sample key is a
64-bit hash of (seed, source, id): a random draw that any worker computes alone. Every length range of
the source is therefore represented as it occurs, with less variance than one random draw, which matters
twice: the heads see short and long documents alike, and the thresholds calibrated on the held-out part
of this sample hit keep rates that hold on the whole source.

Deterministic for a seed, and independent of row order and of how rows are split into files, so a rerun
over the same documents read in a different shard order labels the same sample.

`split_sample` draws, from one source's documents, the sample to label and, from the rest, the
calibration sample that thresholds are set on (scored by the heads, never labelled). `sample_slice`
draws the same two samples from a stage's slice in the lake without reading it into this process: Ray
tasks per file return a histogram of lengths, then each bucket's smallest keys in their file, and
finally the drawn rows themselves (`moe_dag.engine.tasks.map_tasks`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.engine.tasks import map_tasks
from moe_dag.storage.lake import Lake

LENGTH_BUCKETS = 4


def _largest_remainder(total: int, sizes: list[int]) -> list[int]:
    """Split `total` over groups in proportion to `sizes`, rounding by largest remainders."""
    exact = [total * size / sum(sizes) for size in sizes]
    quotas = [int(x) for x in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - quotas[i]), i))
    for i in by_remainder[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


@dataclass(frozen=True)
class Strata:
    """How one source's sample splits over length buckets: what every file's task needs to know."""

    lengths: np.ndarray  # the source's distinct lengths, ascending
    buckets: np.ndarray  # the bucket of each distinct length
    quotas: tuple[int, ...]  # documents drawn per bucket; a source no larger than its sample is taken whole
    take_all: bool

    def bucket_of(self, lengths: np.ndarray) -> np.ndarray:
        return self.buckets[np.searchsorted(self.lengths, lengths)]


def strata(
    lengths: np.ndarray, counts: np.ndarray, size: int, length_buckets: int = LENGTH_BUCKETS
) -> Strata:
    """The strata of a source whose documents have the distinct `lengths` (ascending), `counts` of each."""
    total = int(counts.sum())
    buckets_n = min(length_buckets, size)
    below = np.cumsum(counts) - counts
    buckets = np.minimum(buckets_n - 1, (buckets_n * below) // max(total, 1)).astype(np.int64)
    if total <= size:
        return Strata(lengths, buckets, (), take_all=True)
    sizes = np.bincount(buckets, weights=counts, minlength=buckets_n).astype(np.int64).tolist()
    return Strata(lengths, buckets, tuple(_largest_remainder(size, sizes)), take_all=False)


def sample_keys(ids: list[str], source: str, seed: int) -> np.ndarray:
    """Each document's 64-bit sample key: the draw, the same on any worker and in any row order."""
    prefix = f"{seed}\0{source}\0".encode()
    return np.array(
        [int.from_bytes(hashlib.blake2b(prefix + i.encode(), digest_size=8).digest(), "big") for i in ids],
        dtype=np.uint64,
    )


def _smallest(keys: np.ndarray, ids: list[str], rows: np.ndarray, quota: int) -> list[int]:
    """Of `rows`, the `quota` with the smallest (key, id)."""
    return sorted(rows.tolist(), key=lambda row: (int(keys[row]), ids[row]))[:quota]


def _draw(lengths: np.ndarray, ids: list[str], source: str, plan: Strata, seed: int) -> np.ndarray:
    """Row positions of one source's drawn documents (all of them when the plan takes all)."""
    if plan.take_all:
        return np.arange(len(ids))
    keys = sample_keys(ids, source, seed)
    bucket = plan.bucket_of(lengths)
    chosen = [_smallest(keys, ids, np.flatnonzero(bucket == b), quota) for b, quota in enumerate(plan.quotas)]
    return np.array(sorted(row for rows in chosen for row in rows), dtype=np.int64)


def _histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.unique(lengths, return_counts=True)


def stratified_sample(
    table: pa.Table, per_source: int, seed: int, *, length_buckets: int = LENGTH_BUCKETS
) -> pa.Table:
    """Up to `per_source` rows of each source (all of them when it has fewer), in input order."""
    if per_source < 1:
        raise ValueError(f"per_source must be >= 1, got {per_source}")
    if length_buckets < 1:
        raise ValueError(f"length_buckets must be >= 1, got {length_buckets}")
    sources = np.asarray(table["source"].to_pylist(), dtype=object)
    ids = table["id"].to_pylist()
    lengths = pc.utf8_length(table["text"]).to_numpy(zero_copy_only=False)
    chosen = []
    for source in sorted(set(sources)):
        rows = np.flatnonzero(sources == source)
        plan = strata(*_histogram(lengths[rows]), per_source, length_buckets)
        chosen.append(rows[_draw(lengths[rows], [ids[r] for r in rows], source, plan, seed)])
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


@dataclass(frozen=True)
class _Draw:
    """One draw over a slice's files: its strata, seed, and the rows of each file already taken."""

    source: str
    plan: Strata
    seed: int
    taken: dict[str, frozenset[int]]  # by file path


def sample_slice(
    lake: Lake, stage: str, source: str, columns: list[str], labelled: int, calibration: int, seed: int
) -> tuple[pa.Table, pa.Table]:
    """`split_sample` of the kept rows of `stage`'s slice of `source` (`columns` of them, without
    `keep`), drawn in Ray tasks per file: only the drawn rows come into this process."""
    if labelled < 1:
        raise ValueError(f"per_source must be >= 1, got {labelled}")
    files = lake.parquet_files(stage, source)
    histograms = map_tasks(functools.partial(_file_histogram, lake.url), files)
    lengths, counts = _merged(histograms)
    to_label = _draw_slice(lake, files, _Draw(source, strata(lengths, counts, labelled), seed, {}))
    rest_counts = counts.copy()
    for _, _, length in to_label:
        rest_counts[np.searchsorted(lengths, length)] -= 1
    to_calibrate = []
    if calibration >= 1 and rest_counts.sum():
        taken: dict[str, set[int]] = {}
        for path, row, _ in to_label:
            taken.setdefault(path, set()).add(row)
        frozen = {path: frozenset(rows) for path, rows in taken.items()}
        plan = strata(lengths[rest_counts > 0], rest_counts[rest_counts > 0], calibration)
        to_calibrate = _draw_slice(lake, files, _Draw(source, plan, seed + 1, frozen))
    return _rows(lake, files, to_label, columns), _rows(lake, files, to_calibrate, columns)


def _draw_slice(lake: Lake, files: list[str], draw: _Draw) -> list[tuple[str, int, int]]:
    """(file, row, length) of the drawn documents: each file's task proposes, per bucket, its documents
    with the smallest keys; the smallest of all proposals are the draw."""
    proposals = map_tasks(functools.partial(_file_proposals, lake.url, draw), files)
    chosen = [proposal for proposed in proposals for proposal in proposed]
    if not draw.plan.take_all:
        by_bucket = [sorted(p for p in chosen if p[5] == b) for b in range(len(draw.plan.quotas))]
        chosen = [
            p for bucket, quota in zip(by_bucket, draw.plan.quotas, strict=True) for p in bucket[:quota]
        ]
    return [(path, row, length) for _, _, path, row, length, _ in chosen]


def _rows(lake: Lake, files: list[str], drawn: list[tuple[str, int, int]], columns: list[str]) -> pa.Table:
    """The drawn rows, in slice order (file, then row), read by a task per file that holds any."""
    by_file: dict[str, list[int]] = {}
    for path, row, _ in drawn:
        by_file.setdefault(path, []).append(row)
    wanted = [(path, sorted(by_file[path])) for path in files if path in by_file]
    tables = map_tasks(functools.partial(_file_rows, lake.url, columns), wanted)
    if not tables:
        return _empty(lake, files, columns)
    return pa.concat_tables(tables, promote_options="permissive")


def _empty(lake: Lake, files: list[str], columns: list[str]) -> pa.Table:
    if not files:
        return pa.table({name: pa.array([], pa.string()) for name in columns})
    with lake.fs.open(files[0], "rb") as handle:
        schema = pq.ParquetFile(handle).schema_arrow
    return pa.schema([schema.field(name) for name in columns]).empty_table()


def _merged(histograms: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not histograms:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lengths = np.concatenate([h[0] for h in histograms]).astype(np.int64)
    counts = np.concatenate([h[1] for h in histograms]).astype(np.int64)
    distinct, inverse = np.unique(lengths, return_inverse=True)
    return distinct, np.bincount(inverse, weights=counts, minlength=len(distinct)).astype(np.int64)


def _kept_lengths(lake: Lake, path: str, with_ids: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(kept row positions, their lengths, their ids) of one file."""
    table = lake.read_file(path, ["id", "text", "keep"] if with_ids else ["text", "keep"])
    rows = np.flatnonzero(table["keep"].to_numpy(zero_copy_only=False))
    lengths = pc.utf8_length(table["text"]).to_numpy(zero_copy_only=False)[rows].astype(np.int64)
    ids = table["id"].take(rows).to_pylist() if with_ids else []
    return rows, lengths, ids


def _file_histogram(lake_url: str, path: str) -> tuple[np.ndarray, np.ndarray]:
    _, lengths, _ = _kept_lengths(Lake(lake_url), path, with_ids=False)
    return _histogram(lengths)


def _file_proposals(lake_url: str, draw: _Draw, path: str) -> list[tuple]:
    """(key, id, file, row, length, bucket) of the file's candidates: every eligible row when the plan
    takes all, else each bucket's `quota` smallest (key, id)."""
    rows, lengths, ids = _kept_lengths(Lake(lake_url), path, with_ids=True)
    taken = draw.taken.get(path, frozenset())
    eligible = np.array([row not in taken for row in rows.tolist()], dtype=bool)
    rows, lengths, ids = (
        rows[eligible],
        lengths[eligible],
        [i for i, ok in zip(ids, eligible, strict=True) if ok],
    )
    if draw.plan.take_all:
        return [(0, ids[i], path, int(rows[i]), int(lengths[i]), 0) for i in range(len(ids))]
    keys = sample_keys(ids, draw.source, draw.seed)
    bucket = draw.plan.bucket_of(lengths)
    proposals = []
    for b, quota in enumerate(draw.plan.quotas):
        for i in _smallest(keys, ids, np.flatnonzero(bucket == b), quota):
            proposals.append((int(keys[i]), ids[i], path, int(rows[i]), int(lengths[i]), b))
    return proposals


def _file_rows(lake_url: str, columns: list[str], wanted: tuple[str, list[int]]) -> pa.Table:
    path, rows = wanted
    return Lake(lake_url).read_file(path, columns).take(rows)
