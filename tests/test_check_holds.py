"""A failed blocking check holds what depends on it, in later runs too, until the asset passes again
(issue 21, defect 2: the second unchanged run used to carry an emptied source on to the heads)."""

from __future__ import annotations

import dagster as dg
import pytest
from test_dedup_backfill import pipeline_config, sentence_text, write_shard

from moe_dag.config import load_config
from moe_dag.orchestration.check_holds import CheckHolds, HeldByCheck
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.pipeline import materialize_all
from moe_dag.orchestration.staleness import Staleness
from tests.pipeline_configs import edited_config


def materialized(instance: dg.DagsterInstance, asset: str, partition: str | None = None) -> bool:
    return instance.get_latest_materialization_event(dg.AssetKey(asset)) is not None and (
        partition is None or partition in instance.get_materialized_partitions(dg.AssetKey(asset))
    )


@pytest.mark.slow
def test_an_emptied_source_stays_held_in_later_runs_until_it_passes(tmp_path):
    corpus = tmp_path / "corpus"
    write_shard(corpus / "a", "a-0", {f"a{i}": sentence_text(i) for i in range(12)})
    write_shard(corpus / "b", "b-0", {f"b{i}": f"ok {i}" for i in range(100)})  # one-line texts: all dropped
    config = pipeline_config(tmp_path, corpus, "held")
    instance = dg.DagsterInstance.ephemeral()

    said: list[str] = []
    with pytest.raises(HeldByCheck) as first:
        materialize_all(str(config), instance=instance, log=said.append)
    failed = first.value.failed
    assert {(f.asset, f.partition) for f in failed} == {("prefiltered", "b")}
    assert {f.check for f in failed} == {"source_not_emptied", "drop_share_per_reason"}
    message = str(first.value)
    assert "prefiltered[b]" in message and "kept: 0" in message  # the figures, not only the check's name
    assert materialized(instance, "minhash_signatures", "a") and not materialized(instance, "dedup_clusters")

    said.clear()
    with pytest.raises(HeldByCheck) as second:
        materialize_all(str(config), instance=instance, log=said.append)
    assert {f.check for f in second.value.failed} == {f.check for f in failed}
    assert "minhash_signatures [b]: held by a failed blocking check upstream" in said
    assert not materialized(instance, "minhash_signatures", "b") and not materialized(
        instance, "dedup_clusters"
    )

    # The fix: the source gets documents the filters keep. Its prefiltered partition passes, the hold lifts.
    write_shard(corpus / "b", "b-0", {f"b{i}": sentence_text(100 + i) for i in range(12)})
    definitions = build_definitions(config)
    dg.materialize(
        [*definitions.assets, *definitions.asset_checks],
        selection=["raw_documents", "prefiltered"],
        partition_key="b",
        instance=instance,
        resources=definitions.resources,
    )
    holds = CheckHolds(instance, definitions, ["a", "b"])
    assert holds.holding(["minhash_signatures"], "b") == []
    assert holds.holding(["dedup_clusters"], None) == []

    # Issue 21, defect 3: one source's own settings make only that source's partitions stale.
    changed = edited_config(config, {"sources": {"a": {"languages": ["en"]}}}, to=tmp_path / "changed.yaml")
    staleness = Staleness(instance, build_definitions(changed), load_config(changed))
    assert (
        staleness.reason("prefiltered", "a")
        == "stale: the settings of source 'a' that prefiltered reads changed"
    )
    assert staleness.reason("minhash_signatures", "a") is None  # it reads no per-source settings


def test_a_check_bound_is_part_of_the_code_version_of_the_asset_it_checks(tmp_path):
    """Changing `checks.min_head_f1` makes quality_heads stale (so its check runs again), nothing else."""
    corpus = tmp_path / "corpus"
    config = pipeline_config(tmp_path, corpus, "bounds")
    changed = edited_config(config, {"checks": {"min_head_f1": 0.5}}, to=tmp_path / "changed.yaml")
    before = build_definitions(config).resolve_asset_graph()
    after = build_definitions(changed).resolve_asset_graph()
    differ = {
        key.to_user_string()
        for key in before.get_all_asset_keys()
        if before.get(key).code_version != after.get(key).code_version
    }
    assert differ == {"quality_heads"}


def test_one_sources_settings_change_no_code_version_and_only_that_sources_config_version(tmp_path):
    """Issue 21, defect 3: a source's override used to change the code version of `prefiltered` for
    every source; now it changes only that source's settings version (recorded per run)."""
    from moe_dag.orchestration.automation import source_config_version

    config = pipeline_config(tmp_path, tmp_path / "corpus", "per_source")
    changes = {
        "sources": {"b": {"languages": ["en"]}},
        "checks": {"max_drop_share_by_source": {"b": {"default": 0.9}}},
    }
    changed = edited_config(config, changes, to=tmp_path / "changed.yaml")
    before, after = build_definitions(config), build_definitions(changed)
    old, new = before.resolve_asset_graph(), after.resolve_asset_graph()
    changed_versions = {
        key.to_user_string()
        for key in old.get_all_asset_keys()
        if old.get(key).code_version != new.get(key).code_version
    }
    # Only oracle_sample, a global asset that reads whether each source runs language ID (b now does).
    assert changed_versions == {"oracle_sample"}
    spec_before = next(
        spec for asset in before.assets for spec in asset.specs if spec.key.path == ["prefiltered"]
    )
    spec_after = next(
        spec for asset in after.assets for spec in asset.specs if spec.key.path == ["prefiltered"]
    )
    old_config, new_config = load_config(config), load_config(changed)
    assert source_config_version(spec_before, old_config, "a") == source_config_version(
        spec_after, new_config, "a"
    )
    assert source_config_version(spec_before, old_config, "b") != source_config_version(
        spec_after, new_config, "b"
    )
