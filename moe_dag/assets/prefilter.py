"""prefiltered: language ID, length and repetition rules; every row gets a decision and a reason."""

import dagster as dg

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import reconcile_check_spec, run_filter_stage
from moe_dag.data.filters import build_prefilters
from moe_dag.resources import PipelineResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet"},
    deps=["raw_documents"],
    check_specs=[reconcile_check_spec("prefiltered")],
)
def prefiltered(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    source = pipeline.config.source(context.partition_key)
    filters = build_prefilters(pipeline.config.prefilter_for(source), source.kind, source.languages)
    return run_filter_stage(pipeline.lake, source.name, "raw_documents", "prefiltered", filters)
