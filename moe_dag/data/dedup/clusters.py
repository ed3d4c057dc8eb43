"""Duplicate clusters from MinHash signatures, and the keep/reason decision they imply.

`find_duplicate_clusters` works in three steps:
1. Exact: documents with the same content hash (of the normalised text) join one group; only its
   best-ranked member, the representative, goes on, since equal texts have equal signatures.
2. Near: each representative's signature is cut into bands; DuckDB groups (band, hash of the band's
   rows) into buckets and emits every pair sharing a bucket. The grouping is a plain SQL aggregation so
   DuckDB can spill it to disk when the signatures outgrow memory. A bucket of k documents yields
   k (k - 1) / 2 pairs, which stays small once exact copies are collapsed in step 1.
3. Candidate pairs whose estimated Jaccard (the fraction of equal signature rows) reaches the threshold
   are merged by union-find together with the exact groups.

The survivor of a cluster is its best document by (position of its source in `source_priority`, id): a
fixed order, so the same input always gives the same clusters. Documents are numbered in that order
before union-find and each union keeps the smaller root, so a cluster's root is its survivor.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.data.dedup.minhash import MinHashConfig
from moe_dag.data.schema import with_decisions

CLUSTER_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("cluster_id", pa.string(), nullable=False),
        pa.field("is_survivor", pa.bool_(), nullable=False),
        pa.field("duplicate_of", pa.string()),
        pa.field("match", pa.string()),  # "exact" or "near" for duplicates, null for survivors
        pa.field("est_jaccard", pa.float32()),  # with the survivor's signature, null for survivors
    ]
)
# Candidate pairs are verified this many at a time, to bound the two gathered signature matrices.
_PAIRS_PER_CHUNK = 65_536


def find_duplicate_clusters(
    signatures: pa.Table,
    config: MinHashConfig,
    source_priority: Sequence[str],
    con: duckdb.DuckDBPyConnection | None = None,
) -> pa.Table:
    """One `CLUSTER_SCHEMA` row per signature row, in the same order."""
    _check_signatures(signatures, config, source_priority)
    rank = {source: i for i, source in enumerate(source_priority)}
    source_rank = pa.array([rank[s] for s in signatures["source"].to_pylist()], pa.int64())
    order = pc.sort_indices(
        pa.table({"rank": source_rank, "id": signatures["id"]}),
        sort_keys=[("rank", "ascending"), ("id", "ascending")],
    )
    ranked = signatures.take(order)  # row position = survivor preference, best first
    matrix = _signature_matrix(ranked, config)

    _, first, inverse = np.unique(
        ranked["content_hash"].to_numpy(zero_copy_only=False), return_index=True, return_inverse=True
    )
    parent = first[inverse.reshape(-1)]  # every exact copy points at its group's best member
    representatives = np.sort(first)
    if con is None:
        with duckdb.connect() as own_con:
            pairs = _candidate_pairs(matrix, representatives, config, own_con)
    else:
        pairs = _candidate_pairs(matrix, representatives, config, con)
    for a, b in _verified(pairs, matrix, config.jaccard_threshold):
        _union(parent, a, b)
    root = np.array([_find(parent, i) for i in range(len(parent))], dtype=np.int64)

    clusters = _cluster_table(ranked, matrix, root)
    return clusters.take(pc.sort_indices(order))  # back to the input's row order


def apply_dedup(table: pa.Table, clusters: pa.Table) -> pa.Table:
    """Every row of `table` with `duplicate_of`, `cluster_id`, `keep` and `reason` from `clusters` (by id)."""
    position = pc.index_in(table["id"], value_set=clusters["id"])
    if position.null_count:
        missing = table["id"].filter(pc.is_null(position))[0].as_py()
        raise ValueError(f"apply_dedup: document id {missing!r} has no row in the clusters table")
    matched = clusters.take(position)
    table = table.drop_columns([c for c in ("duplicate_of", "cluster_id") if c in table.column_names])
    table = table.append_column("duplicate_of", matched["duplicate_of"])
    table = table.append_column("cluster_id", matched["cluster_id"])
    reason = [None if m is None else f"{m}_duplicate" for m in matched["match"].to_pylist()]
    return with_decisions(table, matched["is_survivor"].to_pylist(), reason)


def _check_signatures(signatures: pa.Table, config: MinHashConfig, source_priority: Sequence[str]) -> None:
    missing = {"id", "source", "content_hash", "signature"} - set(signatures.column_names)
    if missing:
        raise ValueError(f"find_duplicate_clusters: the signatures table lacks columns {sorted(missing)}")
    if pc.count_distinct(signatures["id"]).as_py() != signatures.num_rows:
        counts = pc.value_counts(signatures["id"]).to_pylist()
        repeated = next(c["values"] for c in counts if c["counts"] > 1)
        raise ValueError(f"find_duplicate_clusters: document id {repeated!r} appears more than once")
    if len(set(source_priority)) != len(source_priority):
        raise ValueError(f"find_duplicate_clusters: source_priority {list(source_priority)} repeats a source")
    unknown = set(pc.unique(signatures["source"]).to_pylist()) - set(source_priority)
    if unknown:
        raise ValueError(
            f"find_duplicate_clusters: sources {sorted(unknown)} are not in "
            f"source_priority {list(source_priority)}"
        )
    wrong = pc.not_equal(pc.list_value_length(signatures["signature"]), config.num_hashes)
    if pc.any(wrong).as_py():
        bad = signatures["id"].filter(wrong)[0].as_py()
        raise ValueError(
            f"find_duplicate_clusters: document {bad!r} has a signature not of length "
            f"{config.num_hashes} (num_bands x rows_per_band); was it computed with another MinHashConfig?"
        )


def _signature_matrix(signatures: pa.Table, config: MinHashConfig) -> np.ndarray:
    flat = pc.list_flatten(signatures["signature"]).to_numpy()
    return flat.reshape(signatures.num_rows, config.num_hashes)


def _candidate_pairs(
    matrix: np.ndarray, rows: np.ndarray, config: MinHashConfig, con: duckdb.DuckDBPyConnection
) -> np.ndarray:
    """(a, b) row pairs, a < b, that share at least one band bucket; shape (pairs, 2)."""
    view = f"minhash_signatures_{uuid.uuid4().hex}"
    flat = pa.array(matrix[rows].reshape(-1), pa.uint32())
    offsets = pa.array(np.arange(len(rows) + 1, dtype=np.int32) * config.num_hashes, pa.int32())
    con.register(
        view,
        pa.table({"row": pa.array(rows, pa.int64()), "signature": pa.ListArray.from_arrays(offsets, flat)}),
    )
    try:
        pairs = con.execute(
            f"""
            WITH bands AS MATERIALIZED (
                SELECT row, band, hash(signature[band * $r + 1 : (band + 1) * $r]) AS bucket
                FROM {view}, range($b) AS bands(band)
            )
            SELECT DISTINCT x.row AS a, y.row AS b
            FROM bands AS x JOIN bands AS y ON x.band = y.band AND x.bucket = y.bucket AND x.row < y.row
            """,
            {"r": config.rows_per_band, "b": config.num_bands},
        ).fetchnumpy()
    finally:
        con.unregister(view)
    return np.stack([pairs["a"], pairs["b"]], axis=1).astype(np.int64).reshape(-1, 2)


def _verified(pairs: np.ndarray, matrix: np.ndarray, threshold: float) -> np.ndarray:
    """The candidate pairs whose estimated Jaccard reaches `threshold`."""
    chunks = np.array_split(pairs, max(1, -(-len(pairs) // _PAIRS_PER_CHUNK)))
    return np.concatenate(
        [chunk[_estimated_jaccard(matrix[chunk[:, 0]], matrix[chunk[:, 1]]) >= threshold] for chunk in chunks]
    )


def _estimated_jaccard(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x == y).mean(axis=-1)


def _find(parent: np.ndarray, i: int) -> int:
    root = i
    while parent[root] != root:
        root = parent[root]
    while parent[i] != root:  # path compression
        parent[i], i = root, parent[i]
    return int(root)


def _union(parent: np.ndarray, a: int, b: int) -> None:
    root_a, root_b = _find(parent, a), _find(parent, b)
    if root_a != root_b:
        parent[max(root_a, root_b)] = min(root_a, root_b)


def _cluster_table(ranked: pa.Table, matrix: np.ndarray, root: np.ndarray) -> pa.Table:
    """CLUSTER_SCHEMA rows for the ranked documents, given each one's cluster root."""
    is_survivor = root == np.arange(len(root))
    ids = ranked["id"].combine_chunks()
    survivor_id = ids.take(pa.array(root))
    content_hash = ranked["content_hash"].to_numpy(zero_copy_only=False)
    exact = content_hash == content_hash[root]
    jaccard = np.where(exact, 1.0, _estimated_jaccard(matrix, matrix[root])).astype(np.float32)
    match = np.where(is_survivor, None, np.where(exact, "exact", "near")).astype(object)
    return pa.table(
        {
            "id": ids,
            "source": ranked["source"],
            "cluster_id": survivor_id,
            "is_survivor": pa.array(is_survivor),
            "duplicate_of": pa.array(
                np.where(is_survivor, None, survivor_id.to_numpy(zero_copy_only=False)), pa.string()
            ),
            "match": pa.array(match, pa.string()),
            "est_jaccard": pa.array(jaccard, mask=is_survivor),
        },
        schema=CLUSTER_SCHEMA,
    )
