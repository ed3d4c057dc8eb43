"""raw_documents: read one source's shards into the lake; bad records and repeated ids go to quarantine."""

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import RECONCILES, engine_metadata, problems_result, reconcile_check_spec
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.config import PipelineConfig
from moe_dag.curation.counts import unreconciled_shards
from moe_dag.curation.ingest import ingest_source
from moe_dag.engine.shard_ledger import LedgerChanges, ShardLedger, ledger_path, shards_read
from moe_dag.engine.shards import digest_text, output_digest
from moe_dag.operations.bounds import ingest_reconciliation
from moe_dag.settings.curation import ingest_settings
from moe_dag.storage.lake import Lake

LINES_IN_SHARDS = "lines_in_shards"


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    # the shards themselves are the input: the ledger and the data version track them
    metadata=operated(1, ingest_settings, started_by="new_shards_<source>"),
    kinds={"parquet"},
    check_specs=[
        reconcile_check_spec("raw_documents"),
        dg.AssetCheckSpec(
            LINES_IN_SHARDS,
            asset="raw_documents",
            blocking=True,
            description="every shard's non-blank lines, counted in the file apart from ingest, reappear as "
            "documents or quarantine rows (distinct lines per shard)",
        ),
    ],
)
def raw_documents(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Every record of every shard of the source: a document row, or a quarantine row with its error."""
    source = context.partition_key
    settings = ingest_settings(pipeline.config, source)
    run = ingest_source(
        pipeline.lake,
        source,
        settings.shards,
        workers=ray.workers,
        log=context.log.info,
        min_block_rows=ray.min_block_rows,
    )
    ledger = record_ingested(context, pipeline.config, source, run.records)
    counts = run.counts
    documents, quarantined = counts.get("kept", 0), counts.get("quarantined", 0)
    errors = first_errors(pipeline.lake, source) if quarantined else []
    lost = unreconciled_shards(pipeline.lake, source, settings.shards, workers=ray.workers or None)
    return dg.MaterializeResult(
        metadata={
            "documents": documents,
            "quarantined": quarantined,
            "duplicate_ids": counts.get("duplicate_ids", 0),
            "first_quarantine_errors": dg.MetadataValue.json(errors),
            "dagster/row_count": documents,
            "ledger": ledger.describe(),
            **engine_metadata(run),
        },
        data_version=raw_data_version(run.records),
        check_results=[
            problems_result(
                RECONCILES,
                ingest_reconciliation(source, counts.get("records", 0), documents, quarantined),
                {"records": counts.get("records", 0), "documents": documents, "quarantined": quarantined},
            ),
            problems_result(
                LINES_IN_SHARDS, lost, {"shards": len(run.records), "shards_unreconciled": len(lost)}
            ),
        ],
    )


def record_ingested(
    context: dg.AssetExecutionContext, config: PipelineConfig, source: str, records: dict[str, dict]
) -> LedgerChanges:
    """Enter the shards `raw_documents` just ingested (the inputs of its completion `records`)."""
    read = shards_read(records)
    changes = ShardLedger(ledger_path(config.catalog_path)).record(source, read, context.run.run_id)
    context.log.info(f"shard ledger [{source}]: {changes.describe()}")
    return changes


def first_errors(lake: Lake, source: str, limit: int = 20) -> list[str]:
    """The first `limit` quarantine errors of the source, reading no further than them."""
    errors: list[str] = []
    for batch in lake.iter_batches("quarantine", source, ["error"], batch_rows=limit):
        errors += batch["error"].to_pylist()
        if len(errors) >= limit:
            break
    return errors[:limit]


def raw_data_version(records: dict[str, dict]) -> dg.DataVersion:
    """The source's ingested data: a digest over its finished shards' output digests."""
    return dg.DataVersion(digest_text(*(f"{key}={output_digest(r)}" for key, r in sorted(records.items()))))
