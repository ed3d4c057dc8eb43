"""toxicity_filtered: a toxicity classifier over lines plus a word list."""

import dagster as dg

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import reconcile_check_spec, run_filter_stage
from moe_dag.data.filters import build_toxicity_filters
from moe_dag.resources import PipelineResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet"},
    deps=["deduplicated"],
    check_specs=[reconcile_check_spec("toxicity_filtered")],
)
def toxicity_filtered(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    source = pipeline.config.source(context.partition_key)
    filters = build_toxicity_filters(pipeline.config.toxicity, source.kind)
    return run_filter_stage(pipeline.lake, source.name, "deduplicated", "toxicity_filtered", filters)
