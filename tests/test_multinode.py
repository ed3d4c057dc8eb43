"""The data stages on a Ray cluster of a head and two worker nodes, reached by address, equal one node.

`ray.cluster_utils.Cluster` starts three Ray nodes on this machine, each with its own node id, raylet
and object store: a head with no CPU (so it runs no task, as a head in production should not) and two
workers of one CPU each. The pipeline config names the head's address (`ray.address`), as an
operator's would, and Dagster materialises curation, dedup and scoring of the tiny demo corpus. Every
completion record names the Ray node that did the shard's work: the shards must have run on both
worker nodes, and every table must equal the one a single local Ray node writes from the same corpus.
"""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pytest

from moe_dag.config import load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake
from tests.pipeline_configs import Replace, edited_config
from tests.test_end_to_end import tiny_config

# Curation, dedup and scoring, stage by stage as `moe-dag run` orders them (per source, then global).
STAGES = [
    (["raw_documents", "prefiltered", "minhash_signatures"], True),
    (["dedup_clusters", "neutral_documents"], False),
    (["deduplicated", "toxicity_filtered"], True),
    (["oracle_sample", "oracle_labels", "quality_heads"], False),
    (["scored_documents"], True),
]
PER_SOURCE = [stage for keys, per_source in STAGES if per_source for stage in keys]
OBJECT_STORE = 256 * 1024 * 1024


def config_for(tmp_path, name: str, ray: dict) -> str:
    """The tiny end-to-end config with its own lake, the shared corpus and the given `ray` section."""
    base = tiny_config(tmp_path)  # corpus under tmp_path/corpus, lake under tmp_path/lake
    own = {
        "lake_root": str(tmp_path / name / "lake"),
        "catalog_path": str(tmp_path / name / "catalog.duckdb"),
    }
    return str(edited_config(base, {**own, "ray": Replace(ray)}, to=tmp_path / f"{name}.yaml"))


def materialise(config_path: str) -> Lake:
    definitions = build_definitions(config_path)
    config = load_config(config_path)
    instance = dg.DagsterInstance.ephemeral()
    assets = list(definitions.assets) + list(definitions.asset_checks or [])
    for keys, per_source in STAGES:
        for partition in config.source_names if per_source else [None]:
            dg.materialize(
                assets,
                selection=keys,
                partition_key=partition,
                instance=instance,
                resources=definitions.resources,
                raise_on_error=True,
            )
    return Lake(config.lake_root)


def tables(lake: Lake, sources: list[str]) -> dict[tuple[str, str | None], pa.Table]:
    found = {("dedup_clusters", None): lake.read_table("dedup_clusters").sort_by("id")}
    for stage in PER_SOURCE:
        for source in sources:
            found[(stage, source)] = lake.read_table(stage, source).sort_by("id")
    return found


def nodes_that_worked(lake: Lake, sources: list[str]) -> dict[str, set[str]]:
    records = {stage: [r for s in sources for r in lake.records(stage, s).values()] for stage in PER_SOURCE}
    return {stage: {node for r in found for node in r["nodes"]} for stage, found in records.items()}


@pytest.mark.slow
def test_curation_dedup_and_scoring_on_a_head_and_two_workers_equal_one_node(tmp_path, local_ray):
    import ray
    from ray.cluster_utils import Cluster

    config = load_config(tiny_config(tmp_path))
    build_demo_corpus(tmp_path / "corpus", config.demo_corpus)
    sources = config.source_names

    # One node: the test session's local Ray (its settings are the config's), not a second start.
    one_node = materialise(config_for(tmp_path, "one", {"num_cpus": 2, "object_store_gb": 0.25}))
    ray.shutdown()  # the resource connects where the config says, not to the Ray left from one_node

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": OBJECT_STORE, "include_dashboard": False},
    )
    try:
        workers = {cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE).node_id for _ in range(2)}
        cluster.wait_for_nodes()
        three_nodes = materialise(config_for(tmp_path, "three", {"address": cluster.address}))
        assert len(ray.nodes()) == 3  # connected to the cluster, not to a local Ray of its own
    finally:
        ray.shutdown()
        cluster.shutdown()

    worked = nodes_that_worked(three_nodes, sources)
    assert set().union(*worked.values()) == workers  # both workers, never the CPU-less head
    assert all(worked.values()), worked  # every stage's shards ran on the cluster
    local = set().union(*nodes_that_worked(one_node, sources).values())
    assert len(local) == 1 and not local & workers

    expected, got = tables(one_node, sources), tables(three_nodes, sources)
    assert got.keys() == expected.keys()
    for key, table in expected.items():
        assert table.num_rows > 0 and got[key].equals(table), key
