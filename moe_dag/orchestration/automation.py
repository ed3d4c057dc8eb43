"""How the assets are operated: code versions, declarative automation, backfill policies, run tags.

Applied to every asset in `build_definitions`, in one table, rather than spread over the asset modules.

Code versions. An asset's code version is its stage version (`STAGE_VERSIONS`: bump it when the stage
gives other output for the same input) plus a digest of the config it reads (`CONFIG_READ`). With the
data versions the assets report (`raw_documents`: its finished shards; `quality_heads`: the heads'
version) and those Dagster derives from code version and inputs for the others, Dagster knows which
assets are stale: an upstream's data version or the asset's code version changed since it was built.
`moe-dag run` and the UI's "Materialize stale and missing" act on that.

Automation. New shards start their source (`new_shards_<source>` sensors); everything downstream
follows by declarative automation, evaluated by the one `moe_dag_automation` sensor: an asset is
requested once after an upstream (partition) updates, when no upstream is missing or running and every
blocking check on its upstreams passed. Exceptions: `dedup_clusters` and `deduplicated` follow the
`dedup_consistency` sensor (issue 11), which rebuilds exactly the partitions whose cluster version
changed; `scored_documents` follows its `toxicity_filtered` partition, and every partition follows a
new heads *version* (`RESCORE_ON_NEW_HEADS`), not any rematerialisation of the heads.

Backfills. Per-source assets read `context.partition_key` and write one source's folders: one run per
partition (`BackfillPolicy.multi_run(1)`), so a backfill of several sources runs them side by side and
one failed source does not fail the others. Global assets are not partitioned: a single run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from moe_dag.assets.scoring import RESCORE_ON_NEW_HEADS
from moe_dag.config import PipelineConfig

TAG_SOURCE = "moe_dag/source"
TAG_CONFIG_VERSION = "moe_dag/config_version"
TAG_LAUNCHED_BY = "moe_dag/launched_by"
TAG_NEW_SHARDS = "moe_dag/new_shards"

STAGE_VERSIONS = {
    "raw_documents": "1",
    "prefiltered": "1",
    "minhash_signatures": "1",
    "dedup_clusters": "1",
    "deduplicated": "1",
    "toxicity_filtered": "1",
    "oracle_sample": "1",
    "oracle_labels": "1",
    "quality_heads": "1",
    "scored_documents": "1",
    "document_catalog": "1",
    "tokenizer": "1",
    "tokenized_mixture": "1",
    "moe_proxy": "1",
    "proxy_eval": "1",
    "unfiltered_mixture": "1",
    "curation_gain": "1",
    "moe_gain": "1",
}


def _per_source(*fields: str) -> Callable[[PipelineConfig], Any]:
    return lambda c: [(s.name, *(getattr(s, f) for f in fields)) for s in c.sources]


# The config each asset's output depends on (its shards and upstream data aside).
CONFIG_READ: dict[str, Callable[[PipelineConfig], Any]] = {
    "raw_documents": lambda c: None,  # the shards themselves: the ledger and the data version
    "prefiltered": lambda c: (c.prefilter, _per_source("kind", "languages", "prefilter")(c)),
    "minhash_signatures": lambda c: c.dedup,
    "dedup_clusters": lambda c: (c.dedup, c.source_names),  # the order is the survivor priority
    "deduplicated": lambda c: None,
    "toxicity_filtered": lambda c: (c.toxicity, _per_source("kind")(c)),
    "oracle_sample": lambda c: (
        c.oracle.per_source,
        c.oracle.seed,
        c.calibration,
        _per_source("keep_rate")(c),
    ),
    "oracle_labels": lambda c: (c.oracle, _per_source("kind")(c)),
    "quality_heads": lambda c: (c.backbone, c.heads, c.calibration, _per_source("kind", "keep_rate")(c)),
    "scored_documents": lambda c: c.backbone,
    "document_catalog": lambda c: None,
    "tokenizer": lambda c: (c.tokenizer, c.mixture),  # the held-out cut comes from the mixture config
    "tokenized_mixture": lambda c: c.mixture,
    "moe_proxy": lambda c: c.training,
    "proxy_eval": lambda c: None,
    "unfiltered_mixture": lambda c: c.mixture,
    "curation_gain": lambda c: c.training,
    "moe_gain": lambda c: c.training,
}

FOLLOW_UPSTREAM = (
    dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
).with_label("follow_upstream")

# None: started by a sensor (raw_documents: new shards; dedup: dedup_consistency), not by automation.
AUTOMATION: dict[str, dg.AutomationCondition | None] = {
    "raw_documents": None,
    "dedup_clusters": None,
    "deduplicated": None,
    "scored_documents": FOLLOW_UPSTREAM.ignore(dg.AssetSelection.assets("quality_heads"))
    | RESCORE_ON_NEW_HEADS,
}


def code_version(asset: str, config: PipelineConfig) -> str:
    read = repr(CONFIG_READ[asset](config)).encode()
    return f"{STAGE_VERSIONS[asset]}-{hashlib.blake2b(read, digest_size=6).hexdigest()}"


def config_version(path: str | Path) -> str:
    """A digest of the config file's bytes: the tag that says which config a run used."""
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=6).hexdigest()


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
    """`assets` with code versions, automation conditions and backfill policies from this module."""

    def attributes(spec: dg.AssetSpec) -> dg.AssetSpec:
        name = spec.key.to_user_string()
        return spec.replace_attributes(
            code_version=code_version(name, config),
            automation_condition=AUTOMATION.get(name, FOLLOW_UPSTREAM),
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
        description="Requests downstream assets after their upstreams update (see moe_dag/orchestration/automation.py).",
    )
