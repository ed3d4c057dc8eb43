"""prefiltered: language ID, length and repetition rules; every row gets a decision and a reason."""

import functools

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import DROP_SHARE, decision_check_specs, decision_result, run_source_stage
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.curation.filters import build_prefilters
from moe_dag.curation.fits import (
    DecisionsBefore,
    fit_source_in_tasks,
    load_fit,
    store_fit,
    with_fit,
)
from moe_dag.curation.work import FilterWork
from moe_dag.engine import StageSpec
from moe_dag.settings.curation import prefilter_settings
from moe_dag.settings.stage import work_digest


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet", "ray"},
    deps=["raw_documents"],
    metadata=operated(1, prefilter_settings),
    check_specs=decision_check_specs("prefiltered", DROP_SHARE),
)
def prefiltered(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    source, lake = context.partition_key, pipeline.lake
    settings = prefilter_settings(pipeline.config, source)
    filters = build_prefilters(settings.filters, settings.kind, settings.languages)
    # Cuts on the source's own distribution (perplexity percentiles) are fitted once and stored, so that
    # every shard, on any worker and in any later run, is decided against the same cuts: a new shard never
    # moves them. Only other settings (`prefilter.refit` among them) make a new fit.
    fit = load_fit(lake, "prefiltered", source)
    refitted = fit is None or fit.settings != work_digest(settings)
    if refitted:
        # Fitted where the data is: tasks run the filters ahead of the cut on each shard's share of the
        # fit sample and score it; this process sets the cuts from the scores.
        fit = fit_source_in_tasks(
            filters,
            lake,
            "raw_documents",
            source,
            settings.filters.perplexity.sample_documents,
            work_digest(settings),
            workers=ray.workers,
        )
        before = DecisionsBefore(lake, "prefiltered", source)
        store_fit(lake, "prefiltered", source, fit)
    context.log.info(f"{'fitted' if refitted else 'stored'} fit {fit.describe()}")
    filters = with_fit(filters, fit)
    spec = StageSpec(
        outputs=("prefiltered",),
        make_work=functools.partial(FilterWork, "prefiltered", functools.partial(list, filters)),
        params=f"{work_digest(settings)} {fit.version}",
        warm=settings.languages is not None,  # the language ID model loads once per worker process
    )
    run = run_source_stage(context, pipeline, ray, spec, "raw_documents")
    extra = {
        "filters": dg.MetadataValue.json(run.counts.get("filters", {})),
        "fit": dg.MetadataValue.json(fit.describe()),
    }
    if refitted:
        # What the new fit (and any new settings with it) changed among documents decided before.
        changed = before.changes()
        extra["decisions_changed"] = sum(changed.values())
        extra["decisions_changed_by_reason"] = dg.MetadataValue.json(changed)
    return decision_result(context, pipeline, run, "raw_documents", settings.checks, extra, DROP_SHARE)
