"""prefiltered: language ID, length and repetition rules; every row gets a decision and a reason."""

import functools

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import DROP_SHARE, decision_check_specs, decision_result, run_source_stage
from moe_dag.data.engine import StageSpec
from moe_dag.data.engine.stages import FilterWork
from moe_dag.data.filters import build_prefilters, fit_to_source
from moe_dag.orchestration.resources import PipelineResource, RayResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet", "ray"},
    deps=["raw_documents"],
    metadata=operated(
        1,
        "prefilter",
        "sources.kind",
        "sources.languages",
        "sources.prefilter",
        "checks.max_drop_share",
        "checks.max_drop_share_by_source.{source}",
    ),
    check_specs=decision_check_specs("prefiltered", DROP_SHARE),
)
def prefiltered(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    source = pipeline.config.source(context.partition_key)
    config = pipeline.config.prefilter_for(source)
    # Cuts on the source's own distribution (perplexity percentiles) are fitted once, here, so that every
    # shard is decided against the same cuts on any number of workers.
    filters = fit_to_source(
        build_prefilters(config, source.kind, source.languages),
        pipeline.lake.iter_batches("raw_documents", source.name),
        config.perplexity.sample_documents,
    )
    cuts = {f.name: f.cuts for f in filters if f.whole_table}
    context.log.info(f"fitted on the source: {cuts}")
    spec = StageSpec(
        outputs=("prefiltered",),
        make_work=functools.partial(FilterWork, "prefiltered", functools.partial(list, filters)),
        params=repr((config, source.kind, source.languages, cuts)),
        actor_pool=source.languages is not None,  # the language ID model loads once per actor
    )
    run = run_source_stage(context, pipeline, ray, spec, "raw_documents")
    filters = run.counts.get("filters", {})
    return decision_result(
        context, pipeline, run, "raw_documents", {"filters": dg.MetadataValue.json(filters)}, DROP_SHARE
    )
