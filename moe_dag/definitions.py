"""The one Definitions of moe-dag: assets, checks, jobs, schedules and resources."""

import dagster as dg

from moe_dag.assets import (
    catalog,
    dedup,
    heads,
    ingest,
    mixture,
    oracle,
    prefilter,
    scoring,
    toxicity,
    training,
)
from moe_dag.assets.partitions import SOURCE_PARTITIONS
from moe_dag.resources import PipelineResource

ASSET_MODULES = [ingest, prefilter, dedup, toxicity, oracle, heads, scoring, catalog, mixture, training]
all_assets = dg.load_assets_from_modules(ASSET_MODULES)

curate_source = dg.define_asset_job(
    "curate_source",
    selection=dg.AssetSelection.assets("raw_documents", "prefiltered", "minhash_signatures"),
    description="Read and prefilter one source (backfill a partition to redo one source alone).",
)

rescore_sources = dg.define_asset_job(
    "rescore_sources",
    selection=dg.AssetSelection.assets("scored_documents"),
    description="Rescore every source's documents with the current quality heads.",
)


@dg.schedule(job=rescore_sources, cron_schedule="0 3 * * 0", default_status=dg.DefaultScheduleStatus.STOPPED)
def weekly_rescoring(context: dg.ScheduleEvaluationContext):
    """Sunday 03:00: one rescoring run per source, so a new heads version reaches every partition."""
    for source in SOURCE_PARTITIONS.get_partition_keys():
        yield dg.RunRequest(
            run_key=f"{context.scheduled_execution_time:%Y-%m-%d}-{source}", partition_key=source
        )


defs = dg.Definitions(
    assets=all_assets,
    asset_checks=dg.load_asset_checks_from_modules(ASSET_MODULES),
    jobs=[curate_source, rescore_sources],
    schedules=[weekly_rescoring],
    resources={"pipeline": PipelineResource()},
)
