"""Duplicate clusters from the signatures of every source, and the keep/reason decision they imply.

The global step reads signatures only, never texts: parquet files (a list of paths or globs, as the
per-source stage writes them, one or more per shard) or, in tests and notebooks, an Arrow table. DuckDB
does the heavy lifting, so it can spill to disk when the signatures outgrow memory.

`find_duplicate_clusters`:
1. Rank: every document gets a row number in survivor-preference order, (position of its source in
   `source_priority`, arrival, id). Each union keeps the smaller root, so a cluster's root is its
   survivor: a fixed order, so the same signatures always give the same clusters, whatever order they
   come in. `arrival` is an optional integer column of the signatures (0 where absent): the clustering
   that first saw the document's shard (`partitioned.recorded_arrivals`), so that within a source a
   document decided earlier outlives a copy that arrives later, whatever their ids.
2. Exact: documents with the same content hash (of the normalised words) form a group; only the first
   of each group, its representative, goes on, since equal texts have equal signatures.
3. Bands: `band_pairs` hashes each band (r signature rows) of every representative and joins on equal
   (band, bucket), yielding each pair of rows that share a bucket. Bands are independent: `workers`
   threads share them out, each with its own DuckDB cursor (at scale, Ray tasks or machines, each a
   list of bands; only their pairs travel; `partitioned` shuffles the buckets instead).
4. Verify: each distinct candidate pair joins a cluster only if its Jaccard similarity reaches the
   threshold: exact on the stored shingle fingerprints by default (the candidates' rows only are
   read), or estimated from the full signatures (equal rows / K) with `verification: estimated`.
   Candidate pairs stream through in record batches.
5. Union-find over the verified pairs, started from the exact groups (numpy; see `_components`).

This is the single-process reference: the pipeline clusters in partitions on Ray
(`partitioned.cluster_partitioned`), and the tests hold that to this function's output. The stage that
applies clusters reads one shard's cluster file in step with the shard's documents (`ShardClusters`).

`cluster_versions` fingerprints each source's decisions: a `deduplicated` partition records the version
it was built from, and a partition whose version differs from the current one is stale. Versions of
disjoint rows combine (`combine_versions`), so each shard's rows carry the version of their own cluster
file, a shard is redone only when that file changes, and the partition's version is its shards'
combined: a new shard leaves the decisions, and the files, of the others alone.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import duckdb
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.curation.dedup.minhash import MinHashConfig
from moe_dag.storage.lake import Lake, duckdb_reading, read_batches
from moe_dag.storage.schema import DUPLICATE_REASONS, with_decisions

CLUSTER_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("cluster_id", pa.string(), nullable=False),
        pa.field("is_survivor", pa.bool_(), nullable=False),
        pa.field("duplicate_of", pa.string()),
        pa.field("match", pa.string()),  # "exact" or "near" for duplicates, null for survivors
        pa.field("jaccard", pa.float32()),  # with the survivor (estimated or exact), null for survivors
    ]
)
CLUSTER_VERSION = "cluster_version"  # the column `apply_dedup` adds: the version the rows were built from
EMPTY_VERSION = "0-" + "0" * 32  # the version of a source without documents
Signatures = pa.Table | str | Sequence[str]  # a table, or parquet paths / globs


def find_duplicate_clusters(
    signatures: Signatures,
    config: MinHashConfig,
    source_priority: Sequence[str],
    workers: int = 1,
    work_dir: str | Path | None = None,
) -> pa.Table:
    """One `CLUSTER_SCHEMA` row per signature row, in survivor-preference order.

    DuckDB keeps its working tables in memory and spills them to a folder under `work_dir` (default:
    the system's temporary folder), so they can outgrow memory; they are dropped at the end.
    """
    if len(set(source_priority)) != len(source_priority):
        raise ValueError(f"find_duplicate_clusters: source_priority {list(source_priority)} repeats a source")
    if workers < 1:
        raise ValueError(f"find_duplicate_clusters: workers must be >= 1, got {workers}")
    with _ranked_documents(signatures, config, source_priority, work_dir) as con:
        exact_root = con.execute("SELECT exact_root FROM docs ORDER BY row").fetchnumpy()["exact_root"]
        shares = [range(config.num_bands)[i::workers] for i in range(workers)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            [(schema,)] = con.execute("SELECT current_schema()").fetchall()
            found = list(pool.map(lambda bands: _pairs_of_bands(con, schema, bands, config), shares))
        pairs = np.unique(np.concatenate(found), axis=0)
        with _verification_values(con, pairs, config) as values:
            similarity = _jaccard(con, values, pairs, config)
            root = _components(exact_root.astype(np.int64), pairs[similarity >= config.jaccard_threshold])
            return _cluster_table(con, values, root, exact_root, (pairs, similarity), config)


def signature_rows(signatures: Signatures) -> int:
    """How many signature rows the files (or table) hold, from the parquet footers."""
    if isinstance(signatures, pa.Table):
        return signatures.num_rows
    files = [signatures] if isinstance(signatures, str) else list(signatures)
    with duckdb_reading(files) as con:
        return con.read_parquet(files).count("*").fetchall()[0][0]


def band_pairs(con: duckdb.DuckDBPyConnection, bands: Sequence[int], config: MinHashConfig) -> np.ndarray:
    """Distinct (a, b) row pairs, a < b, of representatives whose signatures agree on a whole band.

    One worker's share of the bands: each band is grouped on its own (the join matches band and
    bucket), so any split of the bands across workers finds the same pairs.
    """
    pairs = con.execute(
        """
        WITH buckets AS MATERIALIZED (
            SELECT band, row, hash(signature[band * $rows + 1 : (band + 1) * $rows]) AS bucket
            FROM docs CROSS JOIN (SELECT unnest($bands::INTEGER[]) AS band)
            WHERE row = exact_root
        )
        SELECT DISTINCT x.row AS a, y.row AS b
        FROM buckets AS x JOIN buckets AS y ON x.band = y.band AND x.bucket = y.bucket AND x.row < y.row
        """,
        {"rows": config.rows_per_band, "bands": list(bands)},
    ).fetchnumpy()
    return np.stack([pairs["a"], pairs["b"]], axis=1).astype(np.int64).reshape(-1, 2)


def cluster_versions(clusters: pa.Table | str | Sequence[str]) -> dict[str, str]:
    """Per source, a fingerprint of its rows' decisions (id, survivor, match): equal iff unchanged.

    Order-free (an XOR of per-row MD5s) and computed by DuckDB over a table or parquet files (paths or
    globs), so it streams over any number of rows."""
    return format_versions(version_parts(clusters))


def version_parts(clusters: pa.Table | str | Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per source, (rows, XOR of the rows' MD5s): parts of disjoint rows combine by sum and XOR."""
    with duckdb_reading(clusters) as con:
        clusters_view(con, clusters)
        rows = con.execute(
            """
            SELECT source, count(*), bit_xor(md5_number(
                id || chr(31) || cluster_id || chr(31) || coalesce(match, '')))
            FROM clusters GROUP BY source
            """
        ).fetchall()
    return {source: (int(count), int(digest)) for source, count, digest in rows}


def format_versions(parts: dict[str, tuple[int, int]]) -> dict[str, str]:
    return {source: f"{count}-{digest:032x}" for source, (count, digest) in sorted(parts.items())}


def combine_versions(versions: Iterable[str]) -> str:
    """The version of disjoint sets of rows together (e.g. a source's shards): counts add, digests XOR."""
    count, digest = 0, 0
    for version in versions:
        rows, _, hexdigest = version.partition("-")
        count, digest = count + int(rows), digest ^ int(hexdigest, 16)
    return format_versions({"": (count, digest)})[""]


def table_cluster_version(clusters: pa.Table) -> str:
    """The version of one shard's cluster rows (one source's): what its documents' decisions are built
    from. A source's version combines its shards' (`combine_versions`)."""
    return next(iter(cluster_versions(clusters).values()), EMPTY_VERSION)


def shard_cluster_version(path: str, fs: fsspec.AbstractFileSystem) -> str:
    """`table_cluster_version` of one cluster file."""
    with fs.open(path, "rb") as handle:
        return table_cluster_version(pq.read_table(handle, columns=["source", "id", "cluster_id", "match"]))


def file_cluster_version(lake_url: str, path: str) -> str:
    """`shard_cluster_version` of a cluster file of the lake at `lake_url`: a task's form (`map_tasks`)."""
    return shard_cluster_version(path, Lake(lake_url).fs)


def file_built_from_versions(lake_url: str, path: str) -> list[str]:
    """The distinct cluster versions one `deduplicated` file's rows were built from (none without the
    column): a task's form, so that a partition's rows never come into the caller."""
    lake = Lake(lake_url)
    with lake.fs.open(path, "rb") as handle:
        if CLUSTER_VERSION not in pq.ParquetFile(handle).schema_arrow.names:
            return []
    return pc.unique(lake.read_file(path, [CLUSTER_VERSION])[CLUSTER_VERSION]).to_pylist()


def clusters_view(con: duckdb.DuckDBPyConnection, clusters: pa.Table | str | Sequence[str]) -> None:
    """A view `clusters` over a table or over parquet files (paths or globs), read as DuckDB goes."""
    if isinstance(clusters, pa.Table):
        con.register("clusters", clusters)
    else:
        con.read_parquet([clusters] if isinstance(clusters, str) else list(clusters)).create_view("clusters")


def cluster_row_counts(clusters: pa.Table | str | Sequence[str]) -> tuple[int, int]:
    """(rows, distinct ids) of a clusters table or files, counted by DuckDB (out of core)."""
    with duckdb_reading(clusters) as con:
        clusters_view(con, clusters)
        rows, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM clusters").fetchone()
    return int(rows), int(distinct)


def cluster_mates(clusters: pa.Table | str | Sequence[str], ids: Sequence[str]) -> list[str]:
    """The ids in a cluster with any of `ids` (them included), found by DuckDB over a clusters table or
    files: only those rows come back, never the table."""
    with duckdb_reading(clusters) as con:
        clusters_view(con, clusters)
        con.register("wanted", pa.table({"id": pa.array(list(ids), pa.string())}))
        rows = con.execute(
            """
            SELECT id FROM clusters
            WHERE cluster_id IN (SELECT cluster_id FROM clusters JOIN wanted USING (id))
            ORDER BY id
            """
        ).fetchall()
    return [row[0] for row in rows]


def apply_dedup(table: pa.Table, clusters: pa.Table) -> pa.Table:
    """Every row of `table` with `duplicate_of`, `cluster_id`, `keep`, `reason` and `cluster_version`.

    Rows are matched to `clusters` by id; `cluster_version` is the version of the row's source in
    `clusters` (`cluster_versions`), so pass the clusters of every document of that source. Hashes the
    whole of `clusters`: the per-shard stage uses `apply_shard_clusters` instead.
    """
    position = pc.index_in(table["id"], value_set=clusters["id"])
    if position.null_count:
        missing = table["id"].filter(pc.is_null(position))[0].as_py()
        raise ValueError(f"apply_dedup: document id {missing!r} has no row in the clusters table")
    versions = cluster_versions(clusters)
    matched = clusters.take(position)
    return _decide(table, matched, [versions[source] for source in matched["source"].to_pylist()])


class ShardClusters:
    """The cluster rows of one shard, read in step with its documents: the clustering writes them in
    the order of the shard's signature rows (`partitioned.cluster_file_name`), which is the order of the
    shard's kept documents, so applying them is a merge join that holds one batch of each side."""

    def __init__(self, path: str, fs: fsspec.AbstractFileSystem, version: str) -> None:
        if not fs.exists(path):
            raise FileNotFoundError(
                f"no cluster rows at {path}: materialise minhash_signatures and dedup_clusters for this shard"
            )
        self.path, self.version = path, version
        self._batches = read_batches(path, fs)
        self._pending: list[pa.Table] = []
        self._held = 0

    def apply(self, table: pa.Table) -> pa.Table:
        """`apply_dedup` for the shard's next `table.num_rows` documents."""
        matched = self._take(table.num_rows)
        if not matched["id"].equals(table["id"]):
            same = pc.equal(matched["id"], table["id"].slice(0, matched.num_rows))
            wrong = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
            missing = table["id"][int(wrong[0]) if len(wrong) else matched.num_rows].as_py()
            raise ValueError(
                f"apply_dedup: document id {missing!r} is not where {self.path} has it: the clusters "
                "predate this shard's documents; materialise minhash_signatures and dedup_clusters"
            )
        return _decide(table, matched, [self.version] * table.num_rows)

    def finish(self) -> None:
        """Every cluster row was matched: none is left over."""
        if self._take(1).num_rows:
            raise ValueError(f"{self.path} holds rows for documents this shard no longer has")

    def _take(self, rows: int) -> pa.Table:
        while self._held < rows:
            batch = next(self._batches, None)
            if batch is None:
                break
            self._pending.append(batch)
            self._held += batch.num_rows
        held = pa.concat_tables(self._pending) if self._pending else CLUSTER_SCHEMA.empty_table()
        taken, rest = held.slice(0, rows), held.slice(rows)
        self._pending, self._held = [rest], rest.num_rows
        return taken


# The drop reasons of dedup: a dropped duplicate's text lives on in its cluster's survivor.


def _decide(table: pa.Table, matched: pa.Table, version: list[str]) -> pa.Table:
    new = ("duplicate_of", "cluster_id", CLUSTER_VERSION)
    table = table.drop_columns([c for c in new if c in table.column_names])
    table = table.append_column("duplicate_of", matched["duplicate_of"])
    table = table.append_column("cluster_id", matched["cluster_id"])
    table = table.append_column(CLUSTER_VERSION, pa.array(version, pa.string()))
    reason = [None if m is None else f"{m}_duplicate" for m in matched["match"].to_pylist()]
    assert set(reason) <= {None, *DUPLICATE_REASONS}, set(reason)
    return with_decisions(table, matched["is_survivor"].to_pylist(), reason)


def built_from_version(table: pa.Table) -> str:
    """The cluster version `deduplicated` rows were built from: their shards' versions combined (rows
    that `apply_dedup` decided all carry their source's version)."""
    versions = pc.unique(table[CLUSTER_VERSION]).to_pylist() if CLUSTER_VERSION in table.column_names else []
    return combine_versions(versions)


@contextmanager
def _ranked_documents(
    signatures: Signatures, config: MinHashConfig, source_priority: Sequence[str], work_dir: str | Path | None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection whose schema holds `docs`: the signatures with their row number and exact
    group root.

    In memory, spilling to a temporary folder: DuckDB evicts an in-memory database's tables to its
    `temp_directory` as it does a file's, without a file's storage costs (its compression on write and
    checkpoint on close took a quarter of clustering 3,420 signatures). The database is the process's
    (`_cursor`); the schema is this clustering's, dropped at its end.
    """
    with _cursor(work_dir) as con:
        schema = f"clustering_{uuid.uuid4().hex}"
        con.execute(f"CREATE SCHEMA {schema}; USE memory.{schema}")
        try:
            yield _ranked_in(con, signatures, config, source_priority)
        finally:
            con.execute(f"USE memory.main; DROP SCHEMA {schema} CASCADE")


# One in-memory DuckDB database per work folder, for the life of the process: opening one costs 20 ms
# of CPU (as much as clustering 1,000 signatures), a connection to an open one (a cursor) 0.2 ms. Each
# clustering works in a schema of its own, dropped at its end, so concurrent ones do not meet.
_DATABASES: dict[str | None, tuple[duckdb.DuckDBPyConnection, tempfile.TemporaryDirectory]] = {}
_DATABASES_LOCK = threading.Lock()


def _cursor(work_dir: str | Path | None) -> duckdb.DuckDBPyConnection:
    """A new connection to the process's database for `work_dir`, opened on first use. Made under the
    lock: the shared connection refuses a second call while one is under way."""
    key = None if work_dir is None else str(work_dir)
    with _DATABASES_LOCK:
        if key not in _DATABASES:
            folder = tempfile.TemporaryDirectory(dir=work_dir)
            con = duckdb.connect(":memory:", config={"temp_directory": folder.name})
            _DATABASES[key] = (con, folder)
        return _DATABASES[key][0].cursor()


def _ranked_in(
    con: duckdb.DuckDBPyConnection,
    signatures: Signatures,
    config: MinHashConfig,
    source_priority: Sequence[str],
) -> duckdb.DuckDBPyConnection:
    """`docs` in the connection's current schema, checked."""
    if isinstance(signatures, pa.Table):
        con.register("signatures", signatures)
    else:
        files = [signatures] if isinstance(signatures, str) else list(signatures)
        con.read_parquet(files).create_view("signatures")
    columns = _checked_columns(con, config)
    arrival = "arrival" if "arrival" in columns else "0"
    con.execute(
        f"""
        CREATE TABLE docs AS
        WITH ranked AS (
            SELECT row_number() OVER (
                       ORDER BY list_position($priority, source), {arrival}, id
                   ) - 1 AS row,
                   id, source, content_hash, signature
            FROM signatures
        )
        SELECT *, min(row) OVER (PARTITION BY content_hash) AS exact_root FROM ranked
        """,
        {"priority": list(source_priority)},
    )
    _check_documents(con, config, source_priority)
    return con


def _checked_columns(con: duckdb.DuckDBPyConnection, config: MinHashConfig) -> set[str]:
    """The signatures' columns, once they hold every column clustering reads."""
    columns = {row[0] for row in con.execute("DESCRIBE signatures").fetchall()}
    required = {"id", "source", "content_hash", "signature"} | (
        {"fingerprints"} if config.verification == "exact" else set()
    )
    if required - columns:
        hint = (
            " (verification: exact needs signatures computed with it)" if "fingerprints" in required else ""
        )
        raise ValueError(
            f"find_duplicate_clusters: the signatures lack columns {sorted(required - columns)}{hint}"
        )
    return columns


def _check_documents(con: duckdb.DuckDBPyConnection, config: MinHashConfig, priority: Sequence[str]) -> None:
    """Ids, sources and signature lengths, checked in one query over `docs` (each query over the
    signature files would read them again)."""
    repeated, unknown, wrong = con.execute(
        """
        SELECT (SELECT id FROM docs GROUP BY id HAVING count(*) > 1 ORDER BY id LIMIT 1),
               (SELECT list(DISTINCT source ORDER BY source) FROM docs
                WHERE list_position($p, source) IS NULL),
               (SELECT {'id': id, 'length': len(signature)} FROM docs
                WHERE len(signature) != $k ORDER BY row LIMIT 1)
        """,
        {"p": list(priority), "k": config.num_hashes},
    ).fetchone()
    if repeated is not None:
        raise ValueError(f"find_duplicate_clusters: document id {repeated!r} appears more than once")
    if unknown:
        raise ValueError(
            f"find_duplicate_clusters: sources {unknown} are not in source_priority {list(priority)}"
        )
    if wrong is not None:
        raise ValueError(
            f"find_duplicate_clusters: document {wrong['id']!r} has a signature of length "
            f"{wrong['length']}, not {config.num_hashes} (num_bands x rows_per_band); was it computed with "
            "another MinHashConfig?"
        )


def _pairs_of_bands(
    con: duckdb.DuckDBPyConnection, schema: str, bands: range, config: MinHashConfig
) -> np.ndarray:
    """One worker: its own cursor (a connection to the same database, in `schema`) over its share of the
    bands."""
    if not bands:
        return np.empty((0, 2), dtype=np.int64)
    with con.cursor() as cursor:
        cursor.execute(f"USE memory.{schema}")
        return band_pairs(cursor, bands, config)


@contextmanager
def _verification_values(
    con: duckdb.DuckDBPyConnection, pairs: np.ndarray, config: MinHashConfig
) -> Iterator[str]:
    """The table that verification reads `similarity_column` from, by row: `docs` for signatures; with
    `verification: exact`, the fingerprints of the candidates' rows only, fetched once from the
    signatures by id (copying every document's set into `docs` cost more than the clustering)."""
    if config.verification != "exact":
        yield "docs"
        return
    name = f"values_{uuid.uuid4().hex}"
    con.register(f"{name}_rows", pa.table({"row": np.unique(pairs)}))
    try:
        con.execute(
            f"""
            CREATE TEMP TABLE {name} AS
            SELECT d.row, s.fingerprints
            FROM {name}_rows JOIN docs AS d USING (row) JOIN signatures AS s USING (id)
            """
        )
        yield name
    finally:
        con.unregister(f"{name}_rows")
        con.execute(f"DROP TABLE IF EXISTS {name}")


# Candidate pairs streamed from DuckDB at once (its default batch is a million rows, each pair carrying
# both documents' value lists).
VERIFIED_PAIRS_PER_BATCH = 4096
# Values (both sides' lists) that verification copies or sorts at once (exact: as 8-byte keys): the pairs
# of a few long documents, or a whole part's candidates in the partitioned path, can hold hundreds of
# millions.
VALUES_PER_SLICE = 4_000_000


def _jaccard(
    con: duckdb.DuckDBPyConnection, values: str, pairs: np.ndarray, config: MinHashConfig
) -> np.ndarray:
    """The Jaccard similarity of each (a, b) row pair, on the rows of `values`
    (`_verification_values`): estimated, or exact on the shingle fingerprints."""
    column = similarity_column(config)
    view = f"pairs_{uuid.uuid4().hex}"
    con.register(view, pa.table({"i": np.arange(len(pairs)), "a": pairs[:, 0], "b": pairs[:, 1]}))
    similarity = np.empty(len(pairs), dtype=np.float64)
    try:
        reader = con.sql(
            f"""
            SELECT p.i, x.{column} AS x, y.{column} AS y
            FROM {view} AS p JOIN {values} AS x ON x.row = p.a JOIN {values} AS y ON y.row = p.b
            """
        ).to_arrow_reader(VERIFIED_PAIRS_PER_BATCH)
        for batch in reader:
            similarity[batch.column("i").to_numpy()] = pair_similarity(batch["x"], batch["y"], config)
    finally:
        con.unregister(view)
    return similarity


def pair_similarity(x: pa.Array, y: pa.Array, config: MinHashConfig) -> np.ndarray:
    """The Jaccard similarity of each (x[i], y[i]): estimated from signatures (equal rows / K), or exact
    on shingle fingerprints with `verification: exact` (the column `similarity_column` names)."""
    if config.verification == "exact":
        return exact_jaccard(x, y)
    return (_matrix(x, config.num_hashes) == _matrix(y, config.num_hashes)).mean(axis=1)


def similarity_column(config: MinHashConfig) -> str:
    """The signature column that verification compares."""
    return "fingerprints" if config.verification == "exact" else "signature"


def _matrix(lists: pa.ListArray, width: int) -> np.ndarray:
    return pc.list_flatten(lists).to_numpy().reshape(-1, width)


def similarity_by_index(x: pa.Array, y: pa.Array, pairs: np.ndarray, config: MinHashConfig) -> np.ndarray:
    """`pair_similarity` of (x[i], y[j]) for each row (i, j) of `pairs`, taking the lists a slice of pairs
    at a time: a list in many pairs (a document with many near copies) is held once, not once a pair."""
    return _in_slices(
        _lengths(x)[pairs[:, 0]] + _lengths(y)[pairs[:, 1]],
        lambda a, b: pair_similarity(x.take(pairs[a:b, 0]), y.take(pairs[a:b, 1]), config),
    )


def exact_jaccard(x: pa.Array | pa.ChunkedArray, y: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """|X_i & Y_i| / |X_i | Y_i|, X_i and Y_i the sets of the fingerprint lists x[i] and y[i], every pair
    at once: tag each value with its pair and side (pair << 33 | value << 1 | side), sort, drop repeats
    (a set per side), and a value both sides hold is two neighbouring keys that differ in the side bit."""
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    if isinstance(y, pa.ChunkedArray):
        y = y.combine_chunks()
    return _in_slices(
        _lengths(x) + _lengths(y), lambda a, b: _exact_jaccard(x.slice(a, b - a), y.slice(a, b - a))
    )


def _lengths(lists: pa.Array) -> np.ndarray:
    return pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)


def _in_slices(sizes: np.ndarray, compute: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """`compute(start, end)` over consecutive items of about VALUES_PER_SLICE summed `sizes` each (a larger
    item alone), concatenated: what one slice sorts or copies stays bounded."""
    ends = np.searchsorted(
        np.cumsum(sizes, dtype=np.int64), np.arange(1, 1 + sizes.sum() // VALUES_PER_SLICE) * VALUES_PER_SLICE
    )
    bounds = np.unique(np.concatenate([[0], np.maximum(ends, 1), [len(sizes)]])).tolist()
    return np.concatenate(
        [np.empty(0), *(compute(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True))]
    )


def _exact_jaccard(x: pa.Array, y: pa.Array) -> np.ndarray:
    if not len(x):
        return np.empty(0, dtype=np.float64)
    keys = np.concatenate([_tagged(x, 0), _tagged(y, 1)])
    keys.sort()
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    pair = (keys >> np.uint64(33)).astype(np.int64)
    sizes = np.bincount(pair, minlength=len(x))  # |X_i| + |Y_i|
    both = keys[1:][(keys[1:] ^ keys[:-1]) == np.uint64(1)]
    shared = np.bincount((both >> np.uint64(33)).astype(np.int64), minlength=len(x))
    return shared / np.maximum(sizes - shared, 1)


def _tagged(lists: pa.Array | pa.ChunkedArray, side: int) -> np.ndarray:
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = _lengths(lists)
    tags = np.repeat(np.arange(len(lengths), dtype=np.uint64), lengths) << np.uint64(33)
    values = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.uint64)
    return tags | (values << np.uint64(1)) | np.uint64(side)


def _components(parent: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The root (smallest member) of each row's connected component, given initial parent pointers.

    Vectorised union-find: hook the larger root of every edge under the smaller one, then jump pointers
    until every row points at its root; repeat until no edge joins two roots. Hooks only ever point at
    smaller rows, so a component's smallest row, its survivor, stays its root.
    """
    parent = parent.copy()
    a, b = edges[:, 0], edges[:, 1]
    while True:
        while not np.array_equal(parent[parent], parent):
            parent = parent[parent]
        root_a, root_b = parent[a], parent[b]
        apart = root_a != root_b
        if not apart.any():
            return parent
        np.minimum.at(parent, np.maximum(root_a, root_b)[apart], np.minimum(root_a, root_b)[apart])


def _known_or_compared(
    con: duckdb.DuckDBPyConnection,
    values: str,
    pairs: np.ndarray,
    known: tuple[np.ndarray, np.ndarray],
    config: MinHashConfig,
) -> np.ndarray:
    """The similarity of each (a, b) row pair, a < b: looked up among `known` (distinct pairs sorted
    as `np.unique` leaves them, and their similarity), else compared."""
    known_pairs, known_similarity = known
    key, known_key = _pair_keys(pairs), _pair_keys(known_pairs)
    at = np.minimum(np.searchsorted(known_key, key), max(len(known_key) - 1, 0))
    found = known_key[at] == key if len(known_key) else np.zeros(len(key), dtype=bool)
    similarity = np.empty(len(pairs), dtype=np.float64)
    similarity[found] = known_similarity[at[found]]
    similarity[~found] = _jaccard(con, values, pairs[~found], config)
    return similarity


def _pair_keys(pairs: np.ndarray) -> np.ndarray:
    """(a, b) as a << 32 | b: sorted as the pairs sort (a clustering holds under 2^32 rows)."""
    return (pairs[:, 0].astype(np.uint64) << np.uint64(32)) | pairs[:, 1].astype(np.uint64)


def _cluster_table(
    con: duckdb.DuckDBPyConnection,
    values: str,
    root: np.ndarray,
    exact_root: np.ndarray,
    verified: tuple[np.ndarray, np.ndarray],
    config: MinHashConfig,
) -> pa.Table:
    """The cluster rows. A near duplicate's `jaccard` is its survivor's with its exact group's
    representative (the same words, so the same signature and fingerprints), which some candidate
    pair holds, so `values` has it; most such pairs were candidates themselves (`verified`: pairs and
    their similarity), and only the others (reached through a chain) are compared here."""
    con.register("roots", pa.table({"row": np.arange(len(root)), "root": root}))
    near = con.execute(
        """
        SELECT r.row, r.root FROM roots AS r JOIN docs AS d USING (row) JOIN docs AS s ON s.row = r.root
        WHERE r.row != r.root AND d.content_hash != s.content_hash
        """
    ).fetchnumpy()
    rows = near["row"].astype(np.int64)
    near_pairs = np.stack([near["root"], exact_root[rows]], axis=1).astype(np.int64).reshape(-1, 2)
    jaccard = _known_or_compared(con, values, near_pairs, verified, config)
    con.register("near", pa.table({"row": rows, "jaccard": jaccard}))
    table = con.sql(
        """
        SELECT d.id, d.source, s.id AS cluster_id, d.row = r.root AS is_survivor,
               CASE WHEN d.row != r.root THEN s.id END AS duplicate_of,
               CASE WHEN d.row = r.root THEN NULL WHEN n.row IS NULL THEN 'exact' ELSE 'near' END AS match,
               CASE WHEN d.row = r.root THEN NULL ELSE coalesce(n.jaccard, 1.0) END AS jaccard
        FROM docs AS d JOIN roots AS r USING (row) JOIN docs AS s ON s.row = r.root
        LEFT JOIN near AS n ON n.row = d.row
        ORDER BY d.row
        """
    ).to_arrow_table()
    return table.cast(CLUSTER_SCHEMA)
