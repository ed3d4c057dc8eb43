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
    settings_digest,
    store_fit,
    with_fit,
)
from moe_dag.curation.work import FilterWork
from moe_dag.engine import StageSpec


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
    lake = pipeline.lake
    filters = build_prefilters(config, source.kind, source.languages)
    # Cuts on the source's own distribution (perplexity percentiles) are fitted once and stored, so that
    # every shard, on any worker and in any later run, is decided against the same cuts: a new shard never
    # moves them. Only other settings (`prefilter.refit` among them) make a new fit.
    settings = settings_digest((config, source.kind, source.languages))
    fit = load_fit(lake, "prefiltered", source.name)
    refitted = fit is None or fit.settings != settings
    if refitted:
        # Fitted where the data is: tasks run the filters ahead of the cut on each shard's share of the
        # fit sample and score it; this process sets the cuts from the scores.
        fit = fit_source_in_tasks(
            filters,
            lake,
            "raw_documents",
            source.name,
            config.perplexity.sample_documents,
            settings,
            workers=ray.workers,
        )
        before = DecisionsBefore(lake, "prefiltered", source.name)
        store_fit(lake, "prefiltered", source.name, fit)
    context.log.info(f"{'fitted' if refitted else 'stored'} fit {fit.describe()}")
    filters = with_fit(filters, fit)
    spec = StageSpec(
        outputs=("prefiltered",),
        make_work=functools.partial(FilterWork, "prefiltered", functools.partial(list, filters)),
        params=repr((config, source.kind, source.languages, fit.version)),
        warm=source.languages is not None,  # the language ID model loads once per worker process
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
    return decision_result(context, pipeline, run, "raw_documents", extra, DROP_SHARE)
