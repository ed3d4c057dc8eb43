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
from moe_dag.settings.curation import toxicity_settings
from moe_dag.settings.stage import work_digest


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet", "ray"},
    deps=["deduplicated"],
    metadata=operated(1, toxicity_settings),
    check_specs=decision_check_specs("toxicity_filtered", DROP_SHARE),
)
def toxicity_filtered(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    settings = toxicity_settings(pipeline.config, context.partition_key)
    make_filters = functools.partial(build_toxicity_filters, settings.filters, settings.kind)
    spec = StageSpec(
        outputs=("toxicity_filtered",),
        make_work=functools.partial(FilterWork, "toxicity_filtered", make_filters),
        params=work_digest(settings),
        warm=True,  # the classifier loads once per worker process
    )
    run = run_source_stage(context, pipeline, ray, spec, "deduplicated")
    filters = run.counts.get("filters", {})
    return decision_result(
        context,
        pipeline,
        run,
        "deduplicated",
        settings.checks,
        {"filters": dg.MetadataValue.json(filters)},
        DROP_SHARE,
    )
