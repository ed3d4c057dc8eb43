"""Duplicate clusters computed in partitions, as Ray tasks or in a plain loop: the clusters of
`find_duplicate_clusters` (the single-process reference), with no step holding the corpus.

Every signature row is a node, numbered in the order of the signature files (each file's rows follow
the previous file's); "parts" are runs of consecutive files, so a node's part is a range lookup. The
steps, each a task per partition whose outputs are split for the next step (a hash shuffle):

1. Buckets (per part): every row's (band, hash of the band's rows, node, content hash), shuffled by
   bucket to `shuffle_partitions` partitions.
2. Candidates (per bucket partition): within a bucket, equal content hashes are one exact group whose
   smallest node represents it (all its members share every bucket, so each bucket sees the whole
   group); every pair of representatives sharing a bucket is a candidate, as in `band_pairs`, and band
   0 gives each member's exact edge to its representative.
3. Verify (two hops): the part of a candidate's first node sends it to the part of its second node, with
   the first nodes' values (once a node and destination, however many candidates name it); there the
   second nodes' values are read and the Jaccard similarity decides. The verified and exact edges stay in
   the part of their second node: that part's edge partition.
4. Components (rounds): each node starts labelled with itself. A round: every part takes the label
   proposals for its nodes and keeps the smallest, and sends each edge partition the labels of the
   nodes it holds; every edge partition runs union-find over its edges (`_components`) and proposes to
   each node the smallest label of its local component. Rounds stop when no label changes: then each
   edge's ends carry one label, the smallest node of the component, whichever partitions a chain
   crosses. A chain crossing partitions needs a round per crossing, at most the cluster's diameter.
5. Survivors: each touched node goes to its component's part with its (source priority, arrival, id);
   the smallest is the survivor (the reference's rule), which sends its id, content hash and signature
   back to each member.
6. Write (per part): one `CLUSTER_SCHEMA` file per signature file, rows in the signature file's order,
   so the stage that applies them reads exactly the file of the shard it processes
   (`cluster_file_name`), and each file's version (`table_cluster_version`), which the driver writes
   to `<lake>/dedup_clusters/versions.json` once every file is in (`recorded_versions`).

Arrival: a signature file's arrival is the clustering that first saw it (0 for the files of the first,
1 for those new at the next, ...), recorded in `<lake>/dedup_clusters/arrival.json`. Within a source a
document that arrived earlier outlives a later copy whatever the ids, so a new shard never takes the
survivor's place from a document of its own source already decided. Source priority still comes
first: a copy arriving in a source ahead in `source_names` replaces a survivor of a source behind it
(the `dedup_consistency` sensor then rebuilds that source), as a full recomputation would.

Between steps only node numbers, bucket hashes, candidate pairs and, for candidates and duplicates,
signatures travel; documents never do, and the driver holds object references and counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.curation.dedup.clusters import (
    CLUSTER_SCHEMA,
    _components,
    format_versions,
    pair_similarity,
    similarity_by_index,
    similarity_column,
    table_cluster_version,
    version_parts,
)
from moe_dag.curation.dedup.minhash import MinHashConfig
from moe_dag.curation.dedup.report import DuplicateReport, report_from_counts
from moe_dag.storage.lake import Lake

CLUSTERS_STAGE = "dedup_clusters"
SIGNATURES_STAGE = "minhash_signatures"
# In the clusters' folder: cluster file name -> the clustering that first saw the shard.
ARRIVAL_FILE = "arrival.json"
# In the clusters' folder: cluster file name -> its version (`table_cluster_version`), written with the
# files, so that `deduplicated` reads one small file instead of every cluster file of its source.
VERSIONS_FILE = "versions.json"
_MIX = np.uint64(0x9E3779B97F4A7C15)
# Rows per part: a part's signatures (~0.5 KB a row) and its shuffle shares fit a task in ~2 GB.
PART_ROWS = 1_000_000


@dataclass(frozen=True)
class SignatureFile:
    path: str
    source: str
    key: str  # the shard key: the clusters of this file go to `cluster_file_name(source, key)`
    rows: int
    arrival: int = 0  # the clustering that first saw the file: earlier outlives later within a source


@dataclass(frozen=True)
class Part:
    files: tuple[SignatureFile, ...]
    start: int  # node number of its first row

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


@dataclass(frozen=True)
class PartitionedClusters:
    rows: int
    rounds: int  # label-merging rounds of step 4
    candidates: int
    files: list[str]  # the cluster files written
    versions: dict[str, str]  # `cluster_versions` of the files, summed from the parts
    report: DuplicateReport  # `duplicate_report` of the files, summed from the parts


def cluster_file_name(source: str, key: str) -> str:
    """The clusters of one signature shard (neither part may hold a '.': source names and shard keys)."""
    return f"{source}.{key}.parquet"


def signature_files(lake: Lake, sources: Sequence[str]) -> list[SignatureFile]:
    """Every signature file of `sources`, in source order then key order, with its row count (footers)."""
    files = []
    for source in sources:
        for path in lake.parquet_files(SIGNATURES_STAGE, source):
            with lake.fs.open(path, "rb") as handle:
                rows = pq.ParquetFile(handle).metadata.num_rows
            key = posixpath.basename(path).removesuffix(".parquet")
            files.append(SignatureFile(path=path, source=source, key=key, rows=rows))
    return files


def recorded_arrivals(lake: Lake) -> dict[str, int]:
    """Cluster file name -> arrival, as the last clustering recorded it. A lake clustered before arrivals
    were recorded has its cluster files as the first arrival."""
    path = posixpath.join(lake.dataset_dir(CLUSTERS_STAGE), ARRIVAL_FILE)
    recorded = lake.read_json(
        path,
        "restore it from a backup, or remove it to count every cluster file as the first arrival "
        "(within a source, ties between copies may then keep another document), then rematerialise "
        "dedup_clusters",
    )
    return (
        recorded
        if recorded is not None
        else {posixpath.basename(p): 0 for p in lake.parquet_files(CLUSTERS_STAGE)}
    )


def recorded_versions(lake: Lake) -> dict[str, str] | None:
    """Cluster file name -> its version, as the last clustering wrote them; None when no finished
    clustering wrote them (a lake clustered before they were, or a clustering that stopped half way,
    which removes them first): then read them from the files (`shard_cluster_version`)."""
    path = posixpath.join(lake.dataset_dir(CLUSTERS_STAGE), VERSIONS_FILE)
    return lake.read_json(path, "remove it, or rematerialise dedup_clusters, which writes it again")


def with_arrivals(files: Sequence[SignatureFile], recorded: dict[str, int]) -> list[SignatureFile]:
    """`files` with their recorded arrival; the files new since then arrive together, after the rest."""
    new = max(recorded.values(), default=-1) + 1
    return [
        dataclasses.replace(f, arrival=recorded.get(cluster_file_name(f.source, f.key), new)) for f in files
    ]


def plan_parts(files: Sequence[SignatureFile], parts: int) -> list[Part]:
    """Consecutive files in at most `parts` groups of about equal rows (a file is never split)."""
    total = sum(f.rows for f in files)
    cuts = np.linspace(0, total, max(1, min(parts, len(files))) + 1)[1:-1]
    planned, current, start, seen = [], [], 0, 0
    for file in files:
        current.append(file)
        seen += file.rows
        if len(planned) < len(cuts) and seen >= cuts[len(planned)]:
            planned.append(Part(tuple(current), start))
            current, start = [], seen
    if current or not planned:
        planned.append(Part(tuple(current), start))
    return planned


def cluster_partitioned(
    lake: Lake,
    sources: Sequence[str],
    config: MinHashConfig,
    *,
    workers: int = 0,
    part_rows: int = PART_ROWS,
    parts: int | None = None,
    shuffle_partitions: int | None = None,
) -> PartitionedClusters:
    """Cluster the signatures of `sources` (in survivor priority order) and write `dedup_clusters`.

    `workers` 0 runs every step in this process, one task after another; otherwise as Ray tasks on the
    connected Ray. Parts (unless `parts` is given) hold about `part_rows` rows, at least one per worker:
    a task's memory follows the part, not the corpus. Shuffle partitions default to the parts' count."""
    files = with_arrivals(signature_files(lake, sources), recorded_arrivals(lake))
    folder = lake.dataset_dir(CLUSTERS_STAGE)
    if lake.fs.exists(versions_path := posixpath.join(folder, VERSIONS_FILE)):
        lake.fs.rm(versions_path)  # from here until the new files are all written, it would be wrong
    wanted = parts or max(1, workers, -(-sum(f.rows for f in files) // part_rows))
    planned = plan_parts(files, wanted)
    shuffles = shuffle_partitions or len(planned)
    run = RayTasks() if workers else InProcess()
    starts = np.array([p.start for p in planned], dtype=np.int64)
    n_parts = len(planned)
    common = (lake.url, config)

    # Each step's handles are dropped once the next step has them, so Ray frees what was consumed:
    # the driver owns every intermediate object.
    buckets = [run(_bucket_rows, shuffles, p, *common, shuffles) for p in planned]
    candidates = [
        run(_candidates, 2 * n_parts + 1, starts, *[b[s] for b in buckets]) for s in range(shuffles)
    ]
    counts = [c[2 * n_parts] for c in candidates]
    pairs_by_part = [[c[q] for c in candidates] for q in range(n_parts)]
    exact_by_part = [[c[n_parts + q] for c in candidates] for q in range(n_parts)]
    del buckets, candidates
    left = [run(_attach_left, n_parts, p, starts, *common, *pairs_by_part[q]) for q, p in enumerate(planned)]
    del pairs_by_part
    verified = [
        run(
            _verify,
            n_parts + 1,
            p,
            starts,
            *common,
            len(left),
            *[share[q] for share in left],
            *exact_by_part[q],
        )
        for q, p in enumerate(planned)
    ]
    del left, exact_by_part
    labels, rounds, requests = merge_labels(run, planned, verified)
    del verified
    members = [
        run(_members, n_parts, p, starts, *common, list(sources), labels[q], *requests[q])
        for q, p in enumerate(planned)
    ]
    del labels, requests
    survivors = [run(_survivors, n_parts + 1, starts, *[m[r] for m in members]) for r in range(n_parts)]
    del members
    written = run.get(
        [run(_write_part, None, p, *common, *[s[q] for s in survivors]) for q, p in enumerate(planned)]
    )
    candidates_count = sum(run.get(counts))
    sizes: Counter[int] = Counter()
    for part_sizes in run.get([s[n_parts] for s in survivors]):
        sizes.update(part_sizes)
    versions: dict[str, tuple[int, int]] = {}
    for part in written:
        for source, (count, digest) in part["versions"].items():
            total, xor = versions.get(source, (0, 0))
            versions[source] = (total + count, xor ^ digest)
    paths = [path for part in written for path in part["files"]]
    arrivals = {cluster_file_name(f.source, f.key): f.arrival for f in files}
    lake.write_json(posixpath.join(folder, ARRIVAL_FILE), arrivals)
    _remove_other_files(lake, paths)
    file_versions = {name: version for part in written for name, version in part["file_versions"].items()}
    lake.write_json(versions_path, file_versions)
    return PartitionedClusters(
        rows=sum(w["rows"] for w in written),
        rounds=rounds,
        candidates=candidates_count,
        files=paths,
        versions=format_versions(versions),
        report=report_from_counts(sizes, [tuple(row.values()) for w in written for row in w["counts"]]),
    )


def merge_labels(
    run: InProcess | RayTasks, parts: list[Part], edge_partitions: list[list]
) -> tuple[list, int, list[list]]:
    """Step 4: each part's labels (the smallest node of each row's component), the rounds it took, and
    the nodes each edge partition holds per part. `edge_partitions[g]` is `edge_partition`'s output:
    [edges, nodes in part 0, nodes in part 1, ...]."""
    starts = np.array([p.start for p in parts], dtype=np.int64)
    n_parts = len(parts)
    requests = [[v[1 + q] for v in edge_partitions] for q in range(n_parts)]  # [part][edge partition]
    labels = [None] * n_parts
    proposals: list[list[Any]] = [[] for _ in range(n_parts)]
    rounds = 0
    while True:
        stepped = [
            run(_label_step, n_parts + 2, p, labels[q], n_parts, *requests[q], *proposals[q])
            for q, p in enumerate(parts)
        ]
        labels = [s[0] for s in stepped]
        if rounds and sum(run.get([s[1] for s in stepped])) == 0:
            break
        rounds += 1
        edges = [
            run(
                _edge_step,
                n_parts,
                v[0],
                starts,
                n_parts,
                *[r[g] for r in requests],
                *[s[2 + g] for s in stepped],
            )
            for g, v in enumerate(edge_partitions)
        ]
        proposals = [[e[q] for e in edges] for q in range(n_parts)]
    return labels, rounds, requests


def edge_partition(edges: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """An edge partition as `merge_labels` takes it: the edges, then the nodes they touch split by part."""
    nodes = np.unique(edges)
    return [edges, *_split(nodes, _part_of(nodes, starts), len(starts))]


class InProcess:
    """Runs each step at once in this process: a handle is the step's result (a list of `outputs`
    values, or one value when `outputs` is None)."""

    def __call__(self, fn: Callable, outputs: int | None, *args: Any) -> Any:
        return fn(*args)

    def get(self, handles: list) -> list:
        return handles


class RayTasks:
    """Runs each step as a Ray task with one object per output, so a consumer fetches only its share;
    object references passed as arguments resolve in the task."""

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self._remote: dict[Callable, Any] = {}

    def __call__(self, fn: Callable, outputs: int | None, *args: Any) -> Any:
        body = _only_output if outputs == 1 else fn
        if body not in self._remote:  # each function is exported to the workers once
            self._remote[body] = self.ray.remote(body)
        task = self._remote[body]
        arguments = (fn, *args) if outputs == 1 else args
        result = task.options(num_returns=outputs or 1, num_cpus=1).remote(*arguments)
        return [result] if outputs == 1 else result

    def get(self, handles: list) -> list:
        return self.ray.get(handles)


def _only_output(fn: Callable, *args: Any) -> Any:
    """A step split one way: Ray stores a one-element list as one object, so unwrap it."""
    [value] = fn(*args)
    return value


def _read_part(part: Part, lake_url: str, columns: list[str]) -> pa.Table:
    lake = Lake(lake_url)
    tables = [lake.read_file(f.path, columns) for f in part.files]
    # One chunk: `take` on a table of many small chunks costs far more than the copy.
    return pa.concat_tables(tables).combine_chunks() if tables else pa.table({c: [] for c in columns})


def _rows_of_part(part: Part, lake_url: str, column: str, rows: np.ndarray) -> pa.Array:
    """`column` at the part's `rows` (any order, repeats allowed), read one file at a time so that only
    the rows taken are held: with `verification: exact` the column holds every shingle's fingerprint,
    several times a signature's size, and a part's candidates are a fraction of its rows."""
    lake = Lake(lake_url)
    file_of = np.searchsorted(np.cumsum([f.rows for f in part.files]), rows, side="right")
    taken, order, start = [], [], 0
    for i, file in enumerate(part.files):
        mine = np.flatnonzero(file_of == i)
        if len(mine):
            values = lake.read_file(file.path, [column])[column].combine_chunks()
            taken.append(values.take(rows[mine] - start))
            order.append(mine)
        start += file.rows
    if not taken:
        with lake.fs.open(part.files[0].path, "rb") as handle:
            return pa.array([], pq.ParquetFile(handle).schema_arrow.field(column).type)
    back = np.empty(len(rows), dtype=np.int64)
    back[np.concatenate(order)] = np.arange(len(rows))
    return pa.concat_arrays(taken).take(back)


def _part_of(nodes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.searchsorted(starts, nodes, side="right") - 1


def _split(values: np.ndarray, destination: np.ndarray, count: int) -> list[np.ndarray]:
    """Rows of `values` per destination 0..count-1."""
    order = np.argsort(destination, kind="stable")
    bounds = np.searchsorted(destination[order], np.arange(count + 1))
    return [values[order[bounds[i] : bounds[i + 1]]] for i in range(count)]


def _split_table(table: pa.Table, destination: np.ndarray, count: int) -> list[pa.Table]:
    table = table.combine_chunks()
    order = np.argsort(destination, kind="stable")
    bounds = np.searchsorted(destination[order], np.arange(count + 1))
    return [table.take(order[bounds[i] : bounds[i + 1]]) for i in range(count)]


def _mix(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One step of a 64-bit multiply-xorshift hash (wrapping uint64 arithmetic)."""
    h = (h ^ x.astype(np.uint64)) * _MIX
    return h ^ (h >> np.uint64(29))


def _content_keys(hashes: pa.ChunkedArray) -> np.ndarray:
    """Each content hash as two uint64 (blake2b-128 of its text): equal iff the hashes are equal."""
    digest = b"".join(hashlib.blake2b(h.encode(), digest_size=16).digest() for h in hashes.to_pylist())
    return np.frombuffer(digest, dtype=np.uint64).reshape(-1, 2)


def _bucket_rows(part: Part, lake_url: str, config: MinHashConfig, shuffles: int) -> list[np.ndarray]:
    """Step 1: rows (band, bucket, node, content key hi, lo) as int64, split by bucket partition."""
    table = _read_part(part, lake_url, ["id", "content_hash", "signature"])
    lengths = pc.list_value_length(table["signature"]).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != config.num_hashes)
    if len(wrong):
        raise ValueError(
            f"document {table['id'][int(wrong[0])].as_py()!r} has a signature of length "
            f"{lengths[wrong[0]]}, not {config.num_hashes}; was it computed with another MinHashConfig?"
        )
    signatures = pc.list_flatten(table["signature"]).to_numpy().reshape(-1, config.num_hashes)
    nodes = part.start + np.arange(table.num_rows, dtype=np.int64)
    content = _content_keys(table["content_hash"]).view(np.int64)
    rows = []
    for band in range(config.num_bands):
        bucket = np.full(len(nodes), band + 1, dtype=np.uint64) * _MIX
        for column in signatures[:, band * config.rows_per_band : (band + 1) * config.rows_per_band].T:
            bucket = _mix(bucket, column)
        rows.append(np.column_stack([np.full(len(nodes), band), bucket.view(np.int64), nodes, content]))
    everything = np.concatenate(rows) if rows else np.empty((0, 5), dtype=np.int64)
    destination = (_mix(everything[:, 1].view(np.uint64), np.uint64(0)) % np.uint64(shuffles)).astype(
        np.int64
    )
    return _split(everything, destination, shuffles)


def _candidates(starts: np.ndarray, *chunks: np.ndarray) -> list[Any]:
    """Step 2: candidate pairs split by the part of their first node, exact edges (member,
    representative) split by the member's part, and the number of candidates."""
    rows = np.concatenate(chunks) if chunks else np.empty((0, 5), dtype=np.int64)
    rows = rows[np.lexsort((rows[:, 2], rows[:, 4], rows[:, 3], rows[:, 1], rows[:, 0]))]
    bucket_start = _group_starts(rows[:, :2])
    group_start = _group_starts(rows[:, [0, 1, 3, 4]])
    representative = rows[group_start, 2]
    first_of_group = group_start == np.arange(len(rows))
    exact_rows = (rows[:, 0] == 0) & ~first_of_group
    exact = np.column_stack([rows[exact_rows, 2], representative[exact_rows]])
    reps = rows[first_of_group]
    pairs = _pairs_within(reps[:, 2], bucket_start[first_of_group])
    pairs = np.unique(np.sort(pairs, axis=1), axis=0) if len(pairs) else pairs
    n_parts = len(starts)
    return [
        *_split(pairs, _part_of(pairs[:, 0], starts), n_parts),
        *_split(exact, _part_of(exact[:, 0], starts), n_parts),
        len(pairs),
    ]


def _group_starts(keys: np.ndarray) -> np.ndarray:
    """For rows sorted by `keys`, the index of the first row of each row's group."""
    if not len(keys):
        return np.empty(0, dtype=np.int64)
    new = np.concatenate([[True], (keys[1:] != keys[:-1]).any(axis=1)])
    return np.maximum.accumulate(np.where(new, np.arange(len(keys)), 0))


def _pairs_within(nodes: np.ndarray, group_key: np.ndarray) -> np.ndarray:
    """Every pair of `nodes` whose `group_key` (sorted, groups contiguous) is equal."""
    if not len(nodes):
        return np.empty((0, 2), dtype=np.int64)
    new = np.concatenate([[True], group_key[1:] != group_key[:-1]])
    start = np.maximum.accumulate(np.where(new, np.arange(len(nodes)), 0))
    size = np.bincount(start, minlength=len(nodes))[start]
    position = np.arange(len(nodes)) - start
    found, candidates, offset = [], np.flatnonzero(size > 1), 1
    while len(candidates):
        candidates = candidates[position[candidates] + offset < size[candidates]]
        found.append(np.column_stack([nodes[candidates], nodes[candidates + offset]]))
        offset += 1
    return np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)


def _attach_left(
    part: Part, starts: np.ndarray, lake_url: str, config: MinHashConfig, *pairs: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, pa.Array]]:
    """Step 3a: the candidates whose first node is in this part, split by the part of their second node;
    each share with the first nodes it names (sorted) and their values, once a node however many pairs
    it is in (a document is in a pair with each of its near copies)."""
    found = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
    nodes = np.unique(found[:, 0])
    values = _rows_of_part(part, lake_url, similarity_column(config), nodes - part.start)
    shares = []
    for share in _split(found, _part_of(found[:, 1], starts), len(starts)):
        first = np.unique(share[:, 0])
        shares.append((share, first, values.take(np.searchsorted(nodes, first))))
    return shares


def _verify(
    part: Part, starts: np.ndarray, lake_url: str, config: MinHashConfig, n_left: int, *inputs: Any
) -> list[np.ndarray]:
    """Step 3b: the candidates whose second node is here that reach the threshold, with the exact edges
    of this part's members: the part's edge partition, then the nodes it holds split by part."""
    left, exact = inputs[:n_left], inputs[n_left:]
    pairs = np.concatenate([share for share, _, _ in left])
    first = np.concatenate([nodes for _, nodes, _ in left])  # sorted: the shares come in part order
    second, second_row = np.unique(pairs[:, 1], return_inverse=True)
    similarity = similarity_by_index(
        pa.concat_arrays([values for _, _, values in left]),
        _rows_of_part(part, lake_url, similarity_column(config), second - part.start),
        np.column_stack([np.searchsorted(first, pairs[:, 0]), second_row]),
        config,
    )
    verified = pairs[similarity >= config.jaccard_threshold]
    return edge_partition(np.concatenate([verified, *exact]).astype(np.int64), starts)


def _label_step(part: Part, labels: np.ndarray | None, n_edge: int, *inputs: np.ndarray) -> list[Any]:
    """Step 4, per part: the smallest proposal per node; then, per edge partition, the labels of the
    nodes it holds. Returns [labels, changed, lookup per edge partition]."""
    requests, proposals = inputs[:n_edge], inputs[n_edge:]
    current = part.start + np.arange(part.rows, dtype=np.int64) if labels is None else labels.copy()
    before = current.copy()
    for proposal in proposals:
        np.minimum.at(current, proposal[:, 0] - part.start, proposal[:, 1])
    changed = int((current != before).sum())
    return [current, changed, *[current[nodes - part.start] for nodes in requests]]


def _edge_step(edges: np.ndarray, starts: np.ndarray, n_parts: int, *inputs: np.ndarray) -> list[np.ndarray]:
    """Step 4, per edge partition: union-find over its edges; each node's proposal is the smallest
    label of its local component, sent (when smaller than its label) to the node's part."""
    nodes = np.concatenate(inputs[:n_parts])  # sorted: each part's nodes are sorted, parts are ranges
    labels = np.concatenate(inputs[n_parts:])
    local = np.searchsorted(nodes, edges).reshape(-1, 2)
    root = _components(np.arange(len(nodes), dtype=np.int64), local)
    smallest = np.full(len(nodes), np.iinfo(np.int64).max)
    np.minimum.at(smallest, root, labels)
    proposal = smallest[root]
    lower = proposal < labels
    changes = np.column_stack([nodes[lower], proposal[lower]])
    return _split(changes, _part_of(changes[:, 0], starts), n_parts)


def _members(
    part: Part,
    starts: np.ndarray,
    lake_url: str,
    config: MinHashConfig,
    priority: list[str],
    labels: np.ndarray,
    *requests: np.ndarray,
) -> list[pa.Table]:
    """Step 5a: every node of this part that an edge touches, with its component (smallest node),
    priority, arrival and id, content hash and signature, split by the component's part."""
    touched = np.unique(np.concatenate(requests)) if requests else np.empty(0, dtype=np.int64)
    column = similarity_column(config)
    table = _read_part(part, lake_url, ["id", "source", "content_hash"]).take(touched - part.start)
    component = labels[touched - part.start]
    rank = pc.index_in(table["source"], value_set=pa.array(priority, pa.string()))
    arrival = np.repeat([f.arrival for f in part.files], [f.rows for f in part.files]).astype(np.int64)
    members = pa.table(
        {
            "component": component,
            "rank": rank,
            "arrival": arrival[touched - part.start],
            "id": table["id"],
            "source": table["source"],
            "node": touched,
            "content_hash": table["content_hash"],
            "value": _rows_of_part(part, lake_url, column, touched - part.start),
        }
    )
    return _split_table(members, _part_of(component, starts), len(starts))


def _survivors(starts: np.ndarray, *members: pa.Table) -> list[Any]:
    """Step 5b: per component, the member first in (source priority, arrival, id) survives; each member
    gets its survivor's node, id, source, content hash and signature, split by the member's part; last,
    the number of components of each size."""
    table = pa.concat_tables(members).combine_chunks()
    order = [("component", "ascending"), ("rank", "ascending"), ("arrival", "ascending"), ("id", "ascending")]
    table = table.take(pc.sort_indices(table, sort_keys=order))
    component = table["component"].to_numpy()
    first = _group_starts(component.reshape(-1, 1))
    survivor = table.take(first)
    out = pa.table(
        {
            "node": table["node"],
            "survivor_node": survivor["node"],
            "survivor_id": survivor["id"],
            "survivor_source": survivor["source"],
            "survivor_hash": survivor["content_hash"],
            "survivor_value": survivor["value"],
            "content_hash": table["content_hash"],
            "value": table["value"],
        }
    )
    sizes = Counter(np.bincount(first).compress(np.bincount(first) > 0).tolist())
    return [*_split_table(out, _part_of(table["node"].to_numpy(), starts), len(starts)), dict(sizes)]


def _write_part(part: Part, lake_url: str, config: MinHashConfig, *survivors: pa.Table) -> dict[str, Any]:
    """Step 6: the part's cluster rows, one file per signature file, in the signature file's order."""
    lake = Lake(lake_url)
    table = _read_part(part, lake_url, ["id", "source"])
    touched = pa.concat_tables(survivors).combine_chunks()
    touched = touched.filter(pc.not_equal(touched["node"], touched["survivor_node"]))
    row = touched["node"].to_numpy() - part.start
    exact = pc.equal(touched["content_hash"], touched["survivor_hash"]).to_numpy(zero_copy_only=False)
    similarity = np.ones(len(row))
    near = np.flatnonzero(~exact)
    similarity[near] = pair_similarity(
        touched["value"].take(near), touched["survivor_value"].take(near), config
    )
    duplicate = np.zeros(table.num_rows, dtype=bool)
    duplicate[row] = True
    jaccard = np.zeros(table.num_rows, dtype=np.float32)
    jaccard[row] = similarity
    match = np.full(table.num_rows, None, dtype=object)
    match[row] = np.where(exact, "exact", "near")
    # A duplicate's cluster id comes from the survivors' ids appended after the part's own.
    pick = np.arange(table.num_rows)
    pick[row] = table.num_rows + np.arange(len(row))
    cluster_id = pa.concat_arrays(
        [table["id"].combine_chunks(), touched["survivor_id"].combine_chunks().cast(pa.string())]
    ).take(pick)
    clusters = pa.table(
        {
            "id": table["id"],
            "source": table["source"],
            "cluster_id": cluster_id,
            "is_survivor": ~duplicate,
            "duplicate_of": pc.if_else(duplicate, cluster_id, pa.scalar(None, pa.string())),
            "match": pa.array(match, pa.string()),
            "jaccard": pa.array(jaccard, mask=~duplicate),
        }
    ).cast(CLUSTER_SCHEMA)
    survivor_source = np.full(table.num_rows, None, dtype=object)
    survivor_source[row] = touched["survivor_source"].to_numpy(zero_copy_only=False)
    decisions = pa.table(
        {
            "source": table["source"],
            "match": clusters["match"],
            "survivor": pa.array(survivor_source, pa.string()),
        }
    )
    counts = decisions.group_by(["source", "match", "survivor"]).aggregate([("source", "count")])
    files, file_versions, offset = [], {}, 0
    for file in part.files:
        name = cluster_file_name(file.source, file.key)
        rows = clusters.slice(offset, file.rows)
        lake.write_file(rows, path := posixpath.join(lake.dataset_dir(CLUSTERS_STAGE), name))
        files.append(path)
        file_versions[name] = table_cluster_version(rows)
        offset += file.rows
    return {
        "files": files,
        "file_versions": file_versions,
        "rows": table.num_rows,
        "versions": version_parts(clusters),
        "counts": counts.select(["source", "match", "survivor", "source_count"]).to_pylist(),
    }


def _remove_other_files(lake: Lake, keep: list[str]) -> None:
    """Cluster files of shards that are gone, and the single file of earlier layouts."""
    wanted = set(keep)
    for path in lake.parquet_files(CLUSTERS_STAGE):
        if path not in wanted:
            lake.fs.rm(path)
