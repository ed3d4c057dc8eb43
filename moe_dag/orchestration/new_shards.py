"""New data: a sensor per source watches its shard location; the shard ledger says what was ingested.

`new_shards_<source>` lists the source's shard files (the config's `shards`, any fsspec URL) and asks
the ledger which are new or changed (or gone). When some are, it requests one run of that source's
`raw_documents` partition, tagged with the shard paths; its run key names those files and their sizes
and times, so the same new shards are requested once. `raw_documents` enters what it ingested in the
ledger when it succeeds (`record_ingested` in `moe_dag/assets/ingest.py`), so the next evaluation
finds nothing new. Everything downstream follows by declarative automation
(`moe_dag/orchestration/automation.py`).
"""

from __future__ import annotations

import hashlib

import dagster as dg

from moe_dag.config import PipelineConfig, SourceConfig
from moe_dag.engine.shard_ledger import LedgerChanges, ShardFile, ShardLedger, ledger_path, scan_shards
from moe_dag.orchestration.automation import TAG_NEW_SHARDS, run_tags, shards_tag


def new_shards_sensor(config: PipelineConfig, source: SourceConfig) -> dg.SensorDefinition:
    ledger = ShardLedger(ledger_path(config.catalog_path))
    name = f"new_shards_{source.name}"

    @dg.sensor(
        name=name,
        asset_selection=dg.AssetSelection.assets("raw_documents"),
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Ingests new or changed shards under {source.shards} into raw_documents[{source.name}].",
    )
    def sensor(context: dg.SensorEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        shards = scan_shards(source.shards)
        changes = ledger.changes(source.name, shards)
        if not changes:
            return dg.SkipReason(f"no new shards under {source.shards} ({len(shards)} ingested)")
        context.log.info(f"{source.name}: {changes.describe()}")
        return dg.RunRequest(
            run_key=_run_key(changes),
            partition_key=source.name,
            tags=run_tags(config, name, source.name)
            | {TAG_NEW_SHARDS: shards_tag([shard.path for shard in changes.pending] or changes.removed)},
        )

    return sensor


def _run_key(changes: LedgerChanges) -> str:
    def shard_id(shard: ShardFile) -> str:
        return f"{shard.path}:{shard.size}:{shard.mtime}"

    parts = sorted(shard_id(s) for s in changes.pending) + [f"-{path}" for path in changes.removed]
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=12).hexdigest()
