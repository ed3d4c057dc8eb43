"""A snapshot of the asset graph: keys, dependencies, partitioning, pools and checks."""

import dagster as dg

from moe_dag.definitions import defs

EXPECTED_DEPENDENCIES = {
    "raw_documents": set(),
    "prefiltered": {"raw_documents"},
    "minhash_signatures": {"prefiltered"},
    "dedup_clusters": {"minhash_signatures"},
    "deduplicated": {"prefiltered", "dedup_clusters"},
    "toxicity_filtered": {"deduplicated"},
    "oracle_sample": {"toxicity_filtered"},
    "oracle_labels": {"oracle_sample"},
    "quality_heads": {"oracle_labels", "oracle_sample"},
    "scored_documents": {"toxicity_filtered", "quality_heads"},
    "document_catalog": {"scored_documents"},
    "tokenizer": {"scored_documents"},
    "tokenized_mixture": {"tokenizer", "scored_documents"},
    "moe_proxy": {"tokenized_mixture"},
    "proxy_eval": {"moe_proxy"},
}
PER_SOURCE = {
    "raw_documents",
    "prefiltered",
    "minhash_signatures",
    "deduplicated",
    "toxicity_filtered",
    "scored_documents",
}
GPU_POOL = {"oracle_labels", "quality_heads", "scored_documents", "moe_proxy"}


def test_asset_graph_snapshot():
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == set(EXPECTED_DEPENDENCIES)
    for name, parents in EXPECTED_DEPENDENCIES.items():
        node = graph.get(dg.AssetKey(name))
        assert {key.to_user_string() for key in node.parent_keys} == parents, name
        assert (node.partitions_def is not None) == (name in PER_SOURCE), name
        assert (node.pools == {"gpu"}) == (name in GPU_POOL), name


def test_every_filtering_stage_declares_a_blocking_reconciliation_check():
    graph = defs.resolve_asset_graph()
    checks = {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys}
    for stage in ["raw_documents", "prefiltered", "deduplicated", "toxicity_filtered", "scored_documents"]:
        assert (stage, "rows_reconcile") in checks


def test_definitions_validate():
    dg.Definitions.validate_loadable(defs)
    assert {job.name for job in defs.jobs} >= {"curate_source", "rescore_sources"}
