"""toxicity_filtered: a toxicity classifier over lines plus a word list."""

import functools

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import DROP_SHARE, decision_check_specs, decision_result, run_source_stage
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.curation.filters import build_toxicity_filters
from moe_dag.curation.work import FilterWork
from moe_dag.engine import StageSpec


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet", "ray"},
    deps=["deduplicated"],
    metadata=operated(
        1,
        "toxicity",
        "sources.kind",
        "sources.toxicity",
        "checks.max_drop_share",
        "checks.max_drop_share_by_source.{source}",
    ),
    check_specs=decision_check_specs("toxicity_filtered", DROP_SHARE),
)
def toxicity_filtered(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    source = pipeline.config.source(context.partition_key)
    config = pipeline.config.toxicity_for(source)
    make_filters = functools.partial(build_toxicity_filters, config, source.kind)
    spec = StageSpec(
        outputs=("toxicity_filtered",),
        make_work=functools.partial(FilterWork, "toxicity_filtered", make_filters),
        params=repr((config, source.kind)),
        warm=True,  # the classifier loads once per worker process
    )
    run = run_source_stage(context, pipeline, ray, spec, "deduplicated")
    filters = run.counts.get("filters", {})
    return decision_result(
        context, pipeline, run, "deduplicated", {"filters": dg.MetadataValue.json(filters)}, DROP_SHARE
    )
