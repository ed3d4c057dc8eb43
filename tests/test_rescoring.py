"""Rescoring automation: a new heads version requests every scored_documents partition, once."""

import dagster as dg

from moe_dag.orchestration.definitions import build_definitions

DATA_VERSION_TAG = "dagster/data_version"


def test_a_new_heads_version_marks_every_source_for_rescoring_once():
    defs = build_definitions("configs/demo.yaml")
    instance = dg.DagsterInstance.ephemeral()
    scored = dg.AssetKey("scored_documents")

    def tick(cursor=None):
        return dg.evaluate_automation_conditions(
            defs=defs, instance=instance, asset_selection=dg.AssetSelection.assets(scored), cursor=cursor
        )

    def heads_materialised(version: str) -> None:
        instance.report_runless_asset_event(
            dg.AssetMaterialization("quality_heads", tags={DATA_VERSION_TAG: version})
        )

    result = tick()
    assert result.total_requested == 0
    heads_materialised("v1")
    result = tick(result.cursor)
    assert result.get_requested_partitions(scored) == {"code", "prose", "intl"}
    result = tick(result.cursor)
    assert result.total_requested == 0  # requested once, not on every tick
    heads_materialised("v1")  # retrained to identical heads: nothing to rescore
    result = tick(result.cursor)
    assert result.total_requested == 0
    heads_materialised("v2")
    result = tick(result.cursor)
    assert result.get_requested_partitions(scored) == {"code", "prose", "intl"}
