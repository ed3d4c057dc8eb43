"""A snapshot of the asset graph: keys, dependencies, partitioning, pools and checks."""

import dagster as dg
import pytest

from moe_dag.orchestration.definitions import build_definitions

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
    "neutral_documents": {"raw_documents", "dedup_clusters"},
    "tokenizer": {"scored_documents", "neutral_documents"},
    "tokenized_mixture": {"tokenizer", "scored_documents", "neutral_documents"},
    "evaluation_sets": {"tokenizer", "neutral_documents"},
    "moe_proxy": {"tokenized_mixture"},
    "proxy_eval": {"moe_proxy", "evaluation_sets"},
    "unfiltered_mixture": {
        "raw_documents",
        "dedup_clusters",
        "tokenizer",
        "tokenized_mixture",
        "neutral_documents",
    },
    "curation_gain": {"unfiltered_mixture", "proxy_eval", "evaluation_sets"},
    "moe_gain": {"tokenized_mixture", "proxy_eval", "evaluation_sets"},
    "mixture_candidates": {"tokenized_mixture", "evaluation_sets"},
    "candidate_proxy": {"mixture_candidates"},
    "mixture_proposal": {"candidate_proxy"},
    "mixture_validation": {"mixture_proposal"},
    "mixture_search_report": {"mixture_validation"},
}
PER_SOURCE = {
    "raw_documents",
    "prefiltered",
    "minhash_signatures",
    "deduplicated",
    "toxicity_filtered",
    "scored_documents",
}
GPU_POOL = {"oracle_labels", "quality_heads", "scored_documents", "moe_proxy", "curation_gain", "moe_gain"}


def test_asset_graph_snapshot():
    graph = build_definitions().resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == set(EXPECTED_DEPENDENCIES)
    for name, parents in EXPECTED_DEPENDENCIES.items():
        node = graph.get(dg.AssetKey(name))
        assert {key.to_user_string() for key in node.parent_keys} == parents, name
        assert (node.partitions_def is not None) == (name in PER_SOURCE | {"candidate_proxy"}), name
        assert (node.pools == {"gpu"}) == (name in GPU_POOL), name


def test_every_filtering_stage_declares_a_blocking_reconciliation_check():
    graph = build_definitions().resolve_asset_graph()
    checks = {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys}
    for stage in ["raw_documents", "prefiltered", "deduplicated", "toxicity_filtered", "scored_documents"]:
        assert (stage, "rows_reconcile") in checks


def test_definitions_validate():
    defs = build_definitions()
    dg.Definitions.validate_loadable(defs)
    assert {job.name for job in defs.jobs} >= {"curate_source", "rescore_sources"}


def test_importing_the_definitions_reads_no_config(tmp_path, monkeypatch):
    """Dagster can import the module from any folder: the config is read when the definitions load."""
    import subprocess
    import sys

    monkeypatch.setenv("MOE_DAG_CONFIG", str(tmp_path / "missing.yaml"))
    imported = subprocess.run(
        [sys.executable, "-c", "import moe_dag.orchestration.definitions"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        build_definitions()


def test_partitions_are_the_configured_sources():
    graph = build_definitions("configs/demo.yaml").resolve_asset_graph()
    partitions = graph.get(dg.AssetKey("prefiltered")).partitions_def
    assert partitions.get_partition_keys() == ["code", "prose", "intl"]


def test_dedup_consistency_is_automated_and_checked():
    """Issue 11: a backfill's stale deduplicated partitions are rebuilt by a sensor and blocked by a check."""
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    check = dg.AssetCheckKey(dg.AssetKey("deduplicated"), "built_from_current_clusters")
    assert check in graph.asset_check_keys and graph.get(check).blocking
    [sensor] = [s for s in defs.sensors if s.name == "dedup_consistency"]
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    jobs = {target.job_name: defs.resolve_job_def(target.job_name) for target in sensor.targets}
    assert {name: job.asset_layer.executable_asset_keys for name, job in jobs.items()} == {
        "recluster": {dg.AssetKey("dedup_clusters")},
        "rededuplicate_source": {dg.AssetKey("deduplicated")},
    }
    assert (
        jobs["rededuplicate_source"].partitions_def == graph.get(dg.AssetKey("deduplicated")).partitions_def
    )


def test_every_asset_is_versioned_automated_and_has_a_backfill_policy():
    """Issue 12: code versions, declarative automation, backfill policies, a sensor per source."""
    defs = build_definitions("configs/demo.yaml")
    graph = defs.resolve_asset_graph()
    started_by_sensors = {"raw_documents", "dedup_clusters", "deduplicated"}
    searched = {"mixture_candidates", "candidate_proxy", "mixture_proposal", "mixture_validation"}
    for key in graph.get_all_asset_keys():
        node, name = graph.get(key), key.to_user_string()
        assert node.code_version, name
        started_elsewhere = name in started_by_sensors or name in searched | {"mixture_search_report"}
        assert (node.automation_condition is None) == started_elsewhere, name
        policy = node.backfill_policy
        per_partition = name in PER_SOURCE or name == "candidate_proxy"  # a run per source, per candidate
        assert policy.max_partitions_per_run == (1 if per_partition else None), name
    assert "rescore_on_new_heads" in str(graph.get(dg.AssetKey("scored_documents")).automation_condition)
    sensors = {sensor.name: sensor for sensor in defs.sensors}
    assert {"new_shards_code", "new_shards_prose", "new_shards_intl", "moe_dag_automation"} <= set(sensors)
    retries = defs.resolve_assets_def("oracle_labels").op.retry_policy
    assert retries.max_retries == 3 and retries.backoff == dg.Backoff.EXPONENTIAL


def test_a_config_change_changes_the_code_versions_of_the_stages_that_read_it(make_config):
    before = build_definitions(make_config()).resolve_asset_graph()
    after = build_definitions(
        make_config({"dedup": {"jaccard_threshold": 0.7}}, "changed.yaml")
    ).resolve_asset_graph()
    differ = {
        key.to_user_string()
        for key in before.get_all_asset_keys()
        if before.get(key).code_version != after.get(key).code_version
    }
    assert differ == {"minhash_signatures", "dedup_clusters"}
