"""How the assets are operated: code versions, declarative automation, backfill policies, run tags.

Each asset declares its stage version, its settings builder and what starts it on its own decorator
(`operated`, in `moe_dag/assets/operating.py`); `build_definitions` applies what follows from them here.

Code versions. An asset's code version is its stage version (bump it when the stage gives other output
for the same input) plus the digest of its settings object (`moe_dag/settings/`), the only way a stage
reads the config. With the data versions the assets report
(`raw_documents`: its finished shards; `quality_heads`: the heads' version) and those Dagster derives
from code version and inputs for the others, Dagster knows which assets are stale: an upstream's data
version or the asset's code version changed since it was built. `moe-dag run` and the UI's "Materialize
stale and missing" act on that.

Automation. New shards start their source (`new_shards_<source>` sensors); everything downstream
follows by declarative automation, evaluated by the one `moe_dag_automation` sensor: an asset is
requested once after an upstream (partition) updates, when no upstream is missing or running and every
blocking check on its upstreams passed (`FOLLOW_UPSTREAM`). Exceptions: `dedup_clusters` and
`deduplicated` follow the `dedup_consistency` sensor, which rebuilds exactly the partitions whose cluster
version changed; `scored_documents` declares its own condition: it follows its `toxicity_filtered`
partition, and every partition follows a new heads *version*, not any rematerialisation of the heads.

Backfills. Per-source assets read `context.partition_key` and write one source's folders: one run per
partition (`BackfillPolicy.multi_run(1)`), so a backfill of several sources runs them side by side and
one failed source does not fail the others. Global assets are not partitioned: a single run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import dagster as dg

from moe_dag.assets.operating import FOLLOW_UPSTREAM, operation
from moe_dag.config import PipelineConfig, config_version
from moe_dag.settings.stage import builds_per_source, shared_digest, source_digest

TAG_SOURCE = "moe_dag/source"
TAG_CONFIG_VERSION = "moe_dag/config_version"
TAG_LAUNCHED_BY = "moe_dag/launched_by"
TAG_NEW_SHARDS = "moe_dag/new_shards"
TAG_SOURCE_CONFIG = "moe_dag/source_config_versions"
TAG_POPULATION = "moe_dag/population"  # kept documents per source an on-demand asset was built from

# An on-demand asset (a refresh policy declared) is requested by automation only when missing or when its
# code version changed; new data reaches it through its policy in `moe-dag run`, its job or the UI.
ON_DEMAND = (dg.AutomationCondition.on_missing() | dg.AutomationCondition.code_version_changed()).with_label(
    "on_demand"
)


def code_version(spec: dg.AssetSpec, config: PipelineConfig) -> str:
    """The asset's declared stage version plus the digest of what every partition reads of its settings
    object. A per-source asset leaves out each source's own settings: one source's settings must not make
    every source's partition stale, so those are versioned per partition (`source_config_version`)."""
    declared = operation(spec)
    if not builds_per_source(declared.settings):
        return f"{declared.version}-{shared_digest(declared.settings(config))}"
    shared = {shared_digest(declared.settings(config, source)) for source in config.source_names}
    if len(shared) != 1:
        asset = spec.key.to_user_string()
        raise ValueError(f"{asset}'s settings hold a source's own setting in a field not marked per_source()")
    return f"{declared.version}-{shared.pop()}"


def source_config_version(spec: dg.AssetSpec, config: PipelineConfig, source: str) -> str:
    """The digest of what a per-source asset reads of one source's own settings."""
    return source_digest(operation(spec).settings(config, source))


def source_config_tags(assets: Sequence[dg.AssetsDefinition], config: PipelineConfig, source: str) -> dict:
    """The run tag that records, per per-source asset, the version of `source`'s settings it read."""
    versions = {
        spec.key.to_user_string(): source_config_version(spec, config, source)
        for asset in assets
        for spec in asset.specs
        if builds_per_source(operation(spec).settings)
    }
    return {TAG_SOURCE_CONFIG: json.dumps(versions, sort_keys=True)}


def run_tags(config: PipelineConfig, launched_by: str, source: str | None = None) -> dict[str, str]:
    """Tags on every run moe-dag launches: the config version, the source (per-source runs), who."""
    tags = {TAG_CONFIG_VERSION: config_version(config.path), TAG_LAUNCHED_BY: launched_by}
    return tags | ({TAG_SOURCE: source} if source is not None else {})


def shards_tag(paths: Sequence[str], shown: int = 20) -> str:
    """The new shard paths as a JSON list, the first `shown` of them and a count of the rest."""
    listed = list(paths[:shown]) + ([f"... and {len(paths) - shown} more"] if len(paths) > shown else [])
    return json.dumps(listed)


def with_operating_attributes(
    assets: Sequence[dg.AssetsDefinition], config: PipelineConfig
) -> list[dg.AssetsDefinition]:
    """`assets` with code versions and automation conditions from what each declares (`operated`), and
    backfill policies from their partitioning."""

    def attributes(spec: dg.AssetSpec) -> dg.AssetSpec:
        declared = operation(spec)
        follows = ON_DEMAND if declared.refresh else FOLLOW_UPSTREAM
        return spec.replace_attributes(
            code_version=code_version(spec, config),
            automation_condition=(spec.automation_condition or follows) if declared.automated else None,
        )

    operated = []
    for asset in assets:
        asset = asset.map_asset_specs(attributes)
        policy = dg.BackfillPolicy.multi_run(1) if asset.partitions_def else dg.BackfillPolicy.single_run()
        operated.append(asset.with_attributes(backfill_policy=policy))
    return operated


def automation_sensor(config: PipelineConfig) -> dg.AutomationConditionSensorDefinition:
    """The one sensor that evaluates every asset's automation condition (off until turned on)."""
    return dg.AutomationConditionSensorDefinition(
        "moe_dag_automation",
        target=dg.AssetSelection.all(),
        run_tags=run_tags(config, "automation"),
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Requests downstream assets after their upstreams update "
        "(see moe_dag/orchestration/automation.py).",
    )
