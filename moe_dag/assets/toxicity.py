"""toxicity_filtered: a toxicity classifier over lines plus a word list."""

import functools

import dagster as dg

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import decision_result, kept_upstream, reconcile_check_spec, run_source_stage
from moe_dag.data.engine import StageSpec
from moe_dag.data.engine.stages import FilterWork
from moe_dag.data.filters import build_toxicity_filters
from moe_dag.resources import PipelineResource, RayResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet", "ray"},
    deps=["deduplicated"],
    check_specs=[reconcile_check_spec("toxicity_filtered")],
)
def toxicity_filtered(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    source = pipeline.config.source(context.partition_key)
    config = pipeline.config.toxicity
    make_filters = functools.partial(build_toxicity_filters, config, source.kind)
    spec = StageSpec(
        outputs=("toxicity_filtered",),
        make_work=functools.partial(FilterWork, "toxicity_filtered", make_filters),
        params=repr((config, source.kind)),
        actor_pool=True,  # the classifier loads once per actor
    )
    run = run_source_stage(context, pipeline, ray, spec, "deduplicated")
    filters = run.counts.get("filters", {})
    return decision_result(
        run, kept_upstream(pipeline, "deduplicated", source.name), {"filters": dg.MetadataValue.json(filters)}
    )
