"""raw_documents: read one source's shards into the lake; unreadable rows go to quarantine."""

import time

import dagster as dg

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import RECONCILES, reconcile_check_spec
from moe_dag.data.readers import list_shards, read_shards
from moe_dag.resources import PipelineResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet"},
    check_specs=[reconcile_check_spec("raw_documents")],
)
def raw_documents(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Every line of every shard of the source: a document row, or a quarantine row with its error."""
    source = pipeline.config.source(context.partition_key)
    started = time.perf_counter()
    shards = list_shards(source.shards)
    result = read_shards(shards, source.name)
    pipeline.lake.write_table(result.documents, "raw_documents", source.name)
    pipeline.lake.write_table(result.quarantine, "quarantine", source.name)
    documents, quarantined = result.documents.num_rows, result.quarantine.num_rows
    errors = result.quarantine.column("error").to_pylist()[:20]
    return dg.MaterializeResult(
        metadata={
            "shards": len(shards),
            "documents": documents,
            "quarantined": quarantined,
            "first_quarantine_errors": dg.MetadataValue.json(errors),
            "seconds": round(time.perf_counter() - started, 2),
            "dagster/row_count": documents,
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=RECONCILES,
                passed=documents + quarantined == result.lines_read,
                metadata={
                    "lines_read": result.lines_read,
                    "documents": documents,
                    "quarantined": quarantined,
                },
            )
        ],
    )
