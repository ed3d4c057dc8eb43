"""The one Definitions of moe-dag: assets, checks, jobs, schedules, sensors and resources.

Built from one read of the pipeline config (path from `MOE_DAG_CONFIG`, default `configs/demo.yaml`)
when Dagster loads the code location, not when this module is imported.
"""

import os
import sys
from pathlib import Path

import dagster as dg

from moe_dag.assets import (
    catalog,
    comparisons,
    dedup,
    evaluation,
    heads,
    ingest,
    mixture,
    mixture_search,
    oracle,
    prefilter,
    scoring,
    toxicity,
    training,
)
from moe_dag.assets.partitions import bind_source_partitions
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.config import PipelineConfig, config_path_from_env, load_config
from moe_dag.orchestration.automation import automation_sensor, run_tags, with_operating_attributes
from moe_dag.orchestration.instance_health import free_dead_runs, unstick_daemonless_command
from moe_dag.orchestration.new_shards import new_shards_sensor

ASSET_MODULES = [
    ingest,
    prefilter,
    dedup,
    toxicity,
    oracle,
    heads,
    scoring,
    catalog,
    mixture,
    evaluation,
    training,
    comparisons,
    mixture_search,
]

curate_source = dg.define_asset_job(
    "curate_source",
    selection=dg.AssetSelection.assets("raw_documents", "prefiltered", "minhash_signatures"),
    description="Read and prefilter one source (backfill a partition to redo one source alone).",
)

relabel = dg.define_asset_job(
    "relabel",
    selection=dg.AssetSelection.assets("oracle_sample", "oracle_labels", "quality_heads"),
    description="Draw and label a new oracle sample and retrain the quality heads (by hand, or when "
    "refresh.relabel_after_change says the sources moved enough); scored_documents follows the new heads.",
)

remix = dg.define_asset_job(
    "remix",
    selection=dg.AssetSelection.assets("tokenizer", "tokenized_mixture", "moe_proxy", "proxy_eval"),
    description="Retrain the tokenizer, rebuild the mixture and retrain the proxy on the current kept "
    "documents (by hand, or when refresh.remix_after_change says the sources moved enough).",
)

rescore_sources = dg.define_asset_job(
    "rescore_sources",
    selection=dg.AssetSelection.assets("scored_documents"),
    description="Rescore every source's documents with the current quality heads.",
)


def weekly_rescoring_schedule(
    partitions: dg.PartitionsDefinition, config: PipelineConfig
) -> dg.ScheduleDefinition:
    @dg.schedule(
        job=rescore_sources, cron_schedule="0 3 * * 0", default_status=dg.DefaultScheduleStatus.STOPPED
    )
    def weekly_rescoring(context: dg.ScheduleEvaluationContext):
        """Sunday 03:00: one rescoring run per source, so a new heads version reaches every partition."""
        for source in partitions.get_partition_keys():
            yield dg.RunRequest(
                run_key=f"{context.scheduled_execution_time:%Y-%m-%d}-{source}",
                partition_key=source,
                tags=run_tags(config, "weekly_rescoring", source),
            )

    return weekly_rescoring


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def stuck_run_reaper(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    """Every minute: runs whose process is gone are marked failed and the pool slots they hold freed."""
    freed = free_dead_runs(context.instance)
    for line in freed:
        context.log.warning(line)
    return dg.SkipReason("; ".join(freed) or "no stuck run")


def build_definitions(config_path: str | Path | None = None) -> dg.Definitions:
    """Every asset, check, job, schedule and resource for the pipeline config at `config_path`."""
    path = Path(config_path) if config_path is not None else config_path_from_env()
    config = load_config(path)
    partitions, assets = bind_source_partitions(
        dg.load_assets_from_modules(ASSET_MODULES), config.source_names
    )
    new_shards = [new_shards_sensor(config, source) for source in config.sources]
    return dg.Definitions(
        assets=with_operating_attributes(assets, config),
        asset_checks=dg.load_asset_checks_from_modules(ASSET_MODULES),
        jobs=[curate_source, relabel, remix, rescore_sources, mixture_search.mixture_search_job],
        schedules=[weekly_rescoring_schedule(partitions, config)],
        sensors=[stuck_run_reaper, dedup.dedup_consistency, *new_shards, automation_sensor(config)],
        resources={
            "pipeline": PipelineResource(config_path=str(path)),
            "ray": RayResource.from_config(config.ray),
        },
    )


@dg.definitions
def defs() -> dg.Definitions:
    if os.environ.get("DAGSTER_HOME"):
        unstick_daemonless_command(
            dg.DagsterInstance.get(), sys.argv, lambda line: print(line, file=sys.stderr)
        )
    return build_definitions()
