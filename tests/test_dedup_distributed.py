"""Partitioned clustering (moe_dag/curation/dedup/partitioned.py) gives the clusters of the single-process
reference, `find_duplicate_clusters`, however the signatures are split into parts and shuffles; and the
cluster files feed `deduplicated` shard by shard."""

from __future__ import annotations

import posixpath
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_dag.curation.dedup import (
    MinHashConfig,
    ShardClusters,
    apply_dedup,
    cluster_versions,
    compute_signatures,
    find_duplicate_clusters,
    shard_cluster_version,
)
from moe_dag.curation.dedup.clusters import _components
from moe_dag.curation.dedup.partitioned import (
    ARRIVAL_FILE,
    InProcess,
    Part,
    SignatureFile,
    cluster_file_name,
    cluster_partitioned,
    edge_partition,
    merge_labels,
    recorded_arrivals,
    recorded_versions,
    signature_files,
)
from moe_dag.curation.dedup.report import duplicate_report
from moe_dag.storage.lake import Lake

CONFIG = MinHashConfig()
SOURCES = ["reference", "web", "code"]
WORDS = [f"w{i}" for i in range(300)]


def chain(seed: int, length: int, words: int = 200) -> list[str]:
    """Texts each one word away from the previous (word-5-gram Jaccard ~0.95 between neighbours), so
    the ends of a long chain are far apart and join only through the middle."""
    rng = random.Random(seed)
    text = [rng.choice(WORDS) for _ in range(words)]
    texts = [" ".join(text)]
    for _ in range(length - 1):
        text[rng.randrange(words)] = rng.choice(WORDS)
        texts.append(" ".join(text))
    return texts


def corpus(seed: int) -> pa.Table:
    """Chains up to 12 long, exact copies (also across sources), singletons; rows shuffled over sources."""
    rng = random.Random(seed)
    texts = []
    for c in range(6):
        texts += chain(seed * 100 + c, rng.randint(1, 12))
    texts += [texts[rng.randrange(len(texts))] for _ in range(5)]  # exact copies
    texts += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))) for _ in range(10)]
    rng.shuffle(texts)
    sources = [rng.choice(SOURCES) for _ in texts]
    ids = [f"{source}/d{rng.randrange(10**6):06d}-{i}" for i, source in enumerate(sources)]
    return pa.table({"id": ids, "source": sources, "text": texts})


def write_signatures(lake: Lake, signatures: pa.Table, shards: int, rng: random.Random) -> None:
    for source in SOURCES:
        rows = signatures.filter(pc.equal(signatures["source"], source))
        cuts = sorted(rng.randint(0, rows.num_rows) for _ in range(shards - 1))
        for key, (a, b) in enumerate(zip([0, *cuts], [*cuts, rows.num_rows], strict=True)):
            lake.write_file(rows.slice(a, b - a), lake.shard_path("minhash_signatures", source, f"s{key}"))


def sorted_rows(table: pa.Table) -> list[dict]:
    rows = table.to_pylist()
    for row in rows:
        if row["jaccard"] is not None:
            row["jaccard"] = round(row["jaccard"], 5)
    return sorted(rows, key=lambda row: row["id"])


@pytest.mark.parametrize(("seed", "parts", "shuffles"), [(0, 1, 1), (1, 3, 2), (2, 7, 5), (3, 12, 3)])
def test_partitioned_clusters_equal_the_single_process_reference(tmp_path, seed, parts, shuffles):
    signatures = compute_signatures(corpus(seed), CONFIG)
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, signatures, shards=4, rng=random.Random(seed))
    reference = find_duplicate_clusters(signatures, CONFIG, SOURCES)
    assert reference.filter(pc.invert(reference["is_survivor"])).num_rows > 10
    result = cluster_partitioned(lake, SOURCES, CONFIG, parts=parts, shuffle_partitions=shuffles)
    written = lake.read_table("dedup_clusters")
    assert result.rows == written.num_rows == signatures.num_rows
    assert sorted_rows(written) == sorted_rows(reference)
    # The versions and the report, summed from the parts, are those of the whole table.
    assert result.versions == cluster_versions(reference)
    assert result.report == duplicate_report(reference)
    # One file per signature shard, rows in the shard's order.
    shard = lake.read_file(lake.shard_path("minhash_signatures", "web", "s1"), ["id"])
    clusters = lake.read_file(f"{lake.dataset_dir('dedup_clusters')}/{cluster_file_name('web', 's1')}")
    assert clusters["id"].equals(shard["id"])


def test_as_ray_tasks_too(tmp_path, local_ray):
    signatures = compute_signatures(corpus(4), CONFIG)
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, signatures, shards=3, rng=random.Random(4))
    result = cluster_partitioned(lake, SOURCES, CONFIG, workers=2, parts=3, shuffle_partitions=2)
    assert result.rounds >= 2  # chains crossed partitions
    reference = find_duplicate_clusters(signatures, CONFIG, SOURCES)
    assert sorted_rows(lake.read_table("dedup_clusters")) == sorted_rows(reference)


def test_exact_verification_also_equals_the_reference(tmp_path):
    config = MinHashConfig(verification="exact")
    signatures = compute_signatures(corpus(5), config)
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, signatures, shards=3, rng=random.Random(5))
    cluster_partitioned(lake, SOURCES, config, parts=4, shuffle_partitions=3)
    reference = find_duplicate_clusters(signatures, config, SOURCES)
    assert sorted_rows(lake.read_table("dedup_clusters")) == sorted_rows(reference)


def test_rewriting_removes_cluster_files_of_gone_shards(tmp_path):
    signatures = compute_signatures(corpus(6), CONFIG)
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, signatures, shards=3, rng=random.Random(6))
    cluster_partitioned(lake, SOURCES, CONFIG, parts=2)
    lake.remove_shard("minhash_signatures", "web", "s2")
    result = cluster_partitioned(lake, SOURCES, CONFIG, parts=2)
    assert sorted(lake.parquet_files("dedup_clusters")) == sorted(result.files)
    assert cluster_file_name("web", "s2") not in " ".join(result.files)
    # The versions recorded beside the files are the files' own, one for each file there is.
    assert recorded_versions(lake) == {
        posixpath.basename(path): shard_cluster_version(path, lake.fs) for path in result.files
    }


def label_parts(sizes: list[int]) -> list[Part]:
    parts, start = [], 0
    for i, size in enumerate(sizes):
        parts.append(Part((SignatureFile(path="", source="s", key=f"k{i}", rows=size),), start))
        start += size
    return parts


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    data=st.data(),
)
def test_label_rounds_find_the_components_of_any_graph(sizes, data):
    """Random edges, plus a long chain visiting the nodes in random order (so it crosses partitions at
    almost every step), spread over random edge partitions: the labels are the smallest node of each
    component, as single-process union-find gives."""
    nodes = sum(sizes)
    pair = st.tuples(st.integers(0, nodes - 1), st.integers(0, nodes - 1))
    edges = data.draw(st.lists(pair, max_size=3 * nodes))
    order = data.draw(st.permutations(range(nodes)))
    length = data.draw(st.integers(0, nodes))
    edges += list(zip(order[: max(0, length - 1)], order[1:length], strict=True))
    edges = np.array(edges, dtype=np.int64).reshape(-1, 2)
    parts = label_parts(sizes)
    starts = np.array([p.start for p in parts])
    owner = np.array(
        data.draw(st.lists(st.integers(0, len(parts) - 1), min_size=len(edges), max_size=len(edges)))
    )
    partitions = [edge_partition(edges[owner == g], starts) for g in range(len(parts))]
    labels, rounds, _ = merge_labels(InProcess(), parts, partitions)
    expected = _components(np.arange(nodes, dtype=np.int64), edges)
    assert np.array_equal(np.concatenate(labels), expected)


def test_shard_clusters_apply_in_step_equals_apply_dedup_and_names_a_stray_id(tmp_path):
    documents = corpus(7)
    signatures = compute_signatures(documents, CONFIG)
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, signatures, shards=2, rng=random.Random(7))
    cluster_partitioned(lake, SOURCES, CONFIG, parts=2)
    everything = lake.read_table("dedup_clusters")
    path = f"{lake.dataset_dir('dedup_clusters')}/{cluster_file_name('code', 's0')}"
    shard_ids = lake.read_file(lake.shard_path("minhash_signatures", "code", "s0"), ["id"])["id"]
    shard = documents.take(pc.index_in(shard_ids, value_set=documents["id"]))
    version = cluster_versions(everything)["code"]

    clusters = ShardClusters(path, lake.fs, version)
    batches = [clusters.apply(shard.slice(start, 3)) for start in range(0, shard.num_rows, 3)]
    clusters.finish()
    whole = apply_dedup(shard, everything.filter(pc.equal(everything["source"], "code")))
    assert pa.concat_tables(batches).equals(whole)

    swapped = shard.take([1, 0, *range(2, shard.num_rows)])
    with pytest.raises(ValueError, match=f"document id {shard['id'][1].as_py()!r} is not where"):
        ShardClusters(path, lake.fs, version).apply(swapped)
    short = ShardClusters(path, lake.fs, version)
    short.apply(shard.slice(0, shard.num_rows - 1))
    with pytest.raises(ValueError, match="holds rows for documents this shard no longer has"):
        short.finish()
    with pytest.raises(FileNotFoundError, match="materialise minhash_signatures and dedup_clusters"):
        ShardClusters(path + ".gone", lake.fs, version)


def signatures_as_arrived(lake: Lake) -> pa.Table:
    """Every signature file with the arrival the clustering recorded for it: the reference's input."""
    arrivals = recorded_arrivals(lake)
    tables = []
    for file in signature_files(lake, SOURCES):
        table = lake.read_file(file.path)
        arrival = arrivals[cluster_file_name(file.source, file.key)]
        tables.append(table.append_column("arrival", pa.array([arrival] * table.num_rows, pa.int64())))
    return pa.concat_tables(tables)


@pytest.mark.parametrize(("parts", "shuffles", "recorded"), [(1, 1, True), (4, 3, True), (4, 3, False)])
def test_a_later_shard_never_takes_the_place_of_a_survivor_of_its_own_source(
    tmp_path, parts, shuffles, recorded
):
    """A new shard of `web` whose ids sort before every old id, holding copies of web's survivors and
    of reference's documents: no old decision changes (before arrivals, the new copies of web's
    survivors won on their ids), the partitioned clusters equal the reference given the arrivals, and a
    rerun writes the same clusters. `recorded` False: a lake clustered before arrivals were recorded
    (no arrival file), whose cluster files count as the first arrival."""
    documents = corpus(8)
    signatures = compute_signatures(documents, CONFIG)
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, signatures, shards=2, rng=random.Random(8))
    cluster_partitioned(lake, SOURCES, CONFIG, parts=parts, shuffle_partitions=shuffles)
    before = {row["id"]: row for row in sorted_rows(lake.read_table("dedup_clusters"))}
    if not recorded:
        lake.fs.rm(f"{lake.dataset_dir('dedup_clusters')}/{ARRIVAL_FILE}")

    survivors = [r for r in before.values() if r["source"] == "web" and r["is_survivor"]]
    others = [r for r in before.values() if r["source"] == "reference"]
    text = dict(zip(documents["id"].to_pylist(), documents["text"].to_pylist(), strict=True))
    copies = [text[r["id"]] for r in survivors[:6]]
    copies += [text[r["id"]].replace(" ", "  ", 1) for r in others[:3]]  # exact after normalising
    new = pa.table(
        {
            "id": [f"web/!{i:02d}" for i in range(len(copies))],  # '!' sorts before every old id
            "source": ["web"] * len(copies),
            "text": copies,
        }
    )
    lake.write_file(compute_signatures(new, CONFIG), lake.shard_path("minhash_signatures", "web", "new"))
    cluster_partitioned(lake, SOURCES, CONFIG, parts=parts, shuffle_partitions=shuffles)
    after = {row["id"]: row for row in sorted_rows(lake.read_table("dedup_clusters"))}

    assert {i: after[i] for i in before} == before
    assert all(not after[i]["is_survivor"] for i in new["id"].to_pylist())
    assert recorded_arrivals(lake)[cluster_file_name("web", "new")] == 1
    reference = find_duplicate_clusters(signatures_as_arrived(lake), CONFIG, SOURCES)
    assert sorted(after.values(), key=lambda row: row["id"]) == sorted_rows(reference)

    arrivals = recorded_arrivals(lake)
    cluster_partitioned(lake, SOURCES, CONFIG, parts=parts, shuffle_partitions=shuffles)
    assert sorted_rows(lake.read_table("dedup_clusters")) == sorted_rows(reference)
    assert recorded_arrivals(lake) == arrivals
