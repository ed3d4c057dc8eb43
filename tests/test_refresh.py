"""Labels, heads and the mixture follow new data by their refresh policy (issue 21): a new shard that
moves a source's kept documents by less than the configured share does not relabel or retrain."""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest
from test_dedup_backfill import pipeline_config

from moe_dag.assets.operating import operated, operation
from moe_dag.config import load_config
from moe_dag.operations.refresh import Refresh, RefreshConfig, moved_sources, refresh_waiting
from moe_dag.orchestration.automation import with_operating_attributes
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.staleness import Staleness
from moe_dag.settings.quality import catalog_settings


def test_moved_sources_counts_growth_shrinkage_and_new_sources():
    assert moved_sources({"a": 100, "b": 100}, {"a": 119, "b": 81}, 0.2) == []
    assert moved_sources({"a": 100, "b": 100}, {"a": 121, "b": 100}, 0.2) == ["a 100 -> 121"]
    assert moved_sources({"a": 100}, {"a": 100, "c": 5}, 0.2) == ["c 0 -> 5"]
    assert moved_sources({"a": 100}, {"a": 101}, 0.0) == ["a 100 -> 101"]
    with pytest.raises(ValueError, match="refresh.relabel_after_change"):
        RefreshConfig(relabel_after_change=-0.1)


def toy_graph(kept: dict[str, int]) -> list:
    """toxicity_filtered (per source, `kept` documents) -> oracle_sample (the relabelling policy) ->
    scored_documents (per source, scoring every kept document)."""
    sources = dg.StaticPartitionsDefinition(sorted(kept))

    @dg.asset(partitions_def=sources, metadata=operated(1, catalog_settings))
    def toxicity_filtered(context) -> dg.MaterializeResult:
        count = kept[context.partition_key]
        return dg.MaterializeResult(metadata={"kept": count}, data_version=dg.DataVersion(str(count)))

    @dg.asset(
        deps=[toxicity_filtered],
        metadata=operated(
            1,
            catalog_settings,
            refresh=Refresh(population="toxicity_filtered", threshold="relabel_after_change"),
        ),
    )
    def oracle_sample() -> None:
        pass

    @dg.asset(partitions_def=sources, deps=[oracle_sample], metadata=operated(1, catalog_settings))
    def scored_documents(context) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"rows_in": kept[context.partition_key]})

    return [toxicity_filtered, oracle_sample, scored_documents]


def test_an_on_demand_asset_waits_for_its_policy_then_for_the_user(tmp_path):
    """Issue 34, item 6: a relabelling the policy finds due rescores every source, so it waits for
    `--refresh` (or refresh.relabel_without_asking) and says what it would redo and what it may change."""
    kept = {"a": 100, "b": 100}
    config = load_config(pipeline_config(tmp_path, tmp_path / "corpus", "refresh"))
    assets = with_operating_attributes(toy_graph(kept), config)
    definitions = dg.Definitions(assets=assets)
    instance = dg.DagsterInstance.ephemeral()

    def build(asset, partition=None, tags=None):
        dg.materialize(assets, selection=[asset], partition_key=partition, instance=instance, tags=tags)

    def reason(refresh: bool = False, settings=config) -> str | None:
        return Staleness(instance, definitions, settings, refresh=refresh).reason("oracle_sample", None)

    for source in kept:
        build("toxicity_filtered", source)
    staleness = Staleness(instance, definitions, config)
    build("oracle_sample", tags=staleness.population_tags(["oracle_sample"]))
    for source in kept:
        build("scored_documents", source)
    assert reason() is None

    kept["a"] = 110  # a new shard: 10% more, under the 20% of refresh.relabel_after_change
    build("toxicity_filtered", "a")
    assert reason() is None
    assert reason(refresh=True).startswith("stale: ")  # `moe-dag run --refresh`: asked for

    kept["a"] = 130
    build("toxicity_filtered", "a")
    staleness = Staleness(instance, definitions, config)
    assert staleness.reason("oracle_sample", None) is None
    why = "toxicity_filtered's kept documents moved past refresh.relabel_after_change = 0.2: a 100 -> 130"
    assert staleness.waiting == {
        "oracle_sample": f"oracle_sample: waiting for --refresh: {why}. Going ahead redoes oracle_sample, "
        "then scored_documents of every source; up to 200 old scoring decisions may change (the documents "
        "scored now: a 100, b 100). To go ahead: moe-dag run --refresh (or refresh.relabel_without_asking: "
        "true); until then the new documents are scored by the current heads and old decisions stay"
    }
    assert reason(refresh=True).startswith("stale: ")
    unattended = dataclasses.replace(
        config, refresh=dataclasses.replace(config.refresh, relabel_without_asking=True)
    )
    assert reason(settings=unattended) == f"refresh: {why}"


def test_only_relabelling_waits_for_the_user():
    relabel = Refresh(population="toxicity_filtered", threshold="relabel_after_change")
    remix = Refresh(population="scored_documents", threshold="remix_after_change")
    assert RefreshConfig().asks_first(relabel) and not RefreshConfig().asks_first(remix)
    assert not RefreshConfig(relabel_without_asking=True).asks_first(relabel)


def test_the_waiting_message_says_when_nothing_is_scored_yet():
    assert refresh_waiting("oracle_sample", "why", ["oracle_sample"], {}) == (
        "oracle_sample: waiting for --refresh: why. Going ahead redoes oracle_sample; no document is "
        "scored yet. To go ahead: moe-dag run --refresh (or refresh.relabel_without_asking: true); until "
        "then the new documents are scored by the current heads and old decisions stay"
    )


def test_the_evaluation_sets_follow_new_data_with_the_mixture(tmp_path):
    """A new shard brings its own neutral documents, so `neutral_documents` changes on every shard; the
    evaluation sets (and so `proxy_eval`) wait for the mixture's policy instead of following it."""
    definitions = build_definitions(pipeline_config(tmp_path, tmp_path / "corpus", "policies"))
    specs = {spec.key.to_user_string(): spec for asset in definitions.assets for spec in asset.specs}
    remix = operation(specs["tokenizer"]).refresh
    assert remix == Refresh(population="scored_documents", threshold="remix_after_change")
    assert operation(specs["evaluation_sets"]).refresh == remix
