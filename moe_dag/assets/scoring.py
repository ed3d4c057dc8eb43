"""scored_documents: the probe then (for documents that stay) the judge, with early exit.

Rescoring: `quality_heads` records the heads' version as its data version, and this asset's automation
condition (`RESCORE_ON_NEW_HEADS`, declared on the asset) requests every source partition when that
version changes (once the `moe_dag_automation` sensor is on). Shards the current heads already scored
(their completion record names the heads version and thresholds) are not scored again: a rerun with
unchanged heads costs nothing.
The weekly schedule in `moe_dag/orchestration/definitions.py` stays.
"""

import functools

import dagster as dg

from moe_dag.assets.operating import FOLLOW_UPSTREAM, operated
from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import decision_check_specs, decision_result, problems_result, run_source_stage
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.engine import StageSpec
from moe_dag.operations.bounds import keep_rate_violation
from moe_dag.quality.heads import load_heads
from moe_dag.quality.work import ScoringWork
from moe_dag.settings.quality import scoring_settings
from moe_dag.settings.stage import work_digest

KEEP_RATE = "keep_rate_on_target"

RESCORE_ON_NEW_HEADS = (
    dg.AutomationCondition.any_deps_match(dg.AutomationCondition.data_version_changed())
    .allow(dg.AssetSelection.assets("quality_heads"))
    .since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("rescore_on_new_heads")


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="quality",
    kinds={"pytorch", "parquet", "ray"},
    deps=["toxicity_filtered", "quality_heads"],
    metadata=operated(1, scoring_settings),
    automation_condition=FOLLOW_UPSTREAM.ignore(dg.AssetSelection.assets("quality_heads"))
    | RESCORE_ON_NEW_HEADS,
    pool="gpu",
    check_specs=[
        *decision_check_specs("scored_documents"),
        dg.AssetCheckSpec(
            KEEP_RATE,
            asset="scored_documents",
            description="the kept share is within calibration.keep_rate_tolerance of the source's keep rate "
            "(a warning: thresholds calibrated on few documents miss it; quality_heads' "
            "calibrated_on_enough_documents says by how much)",
        ),
    ],
)
def scored_documents(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    source = context.partition_key
    settings = scoring_settings(pipeline.config, source)
    # Each scoring actor (on any node) reads its own local copy of the published heads.
    heads_dir = pipeline.lake.artifact("quality_heads")
    stored = load_heads(heads_dir)
    if source not in stored.thresholds:
        raise dg.Failure(
            f"heads {stored.version} have no thresholds for source {source!r}; see quality_heads"
        )
    spec = StageSpec(
        outputs=("scored_documents",),
        make_work=functools.partial(ScoringWork, heads_dir, source),
        # Shards scored by the current heads with the current thresholds are not scored again; a new
        # heads version or new thresholds rescore every shard.
        params=repr((work_digest(settings), stored.version, stored.thresholds[source])),
        warm=True,  # backbone and heads load once per worker process
        num_gpus=ray.scoring_gpus,
    )
    run = run_source_stage(context, pipeline, ray, spec, "toxicity_filtered")
    counts = run.counts
    documents = max(counts.get("documents", 0), 1)
    kept_rate = counts.get("kept", 0) / documents
    result = decision_result(
        context,
        pipeline,
        run,
        "toxicity_filtered",
        settings.checks,
        {
            "heads_version": stored.version,
            "early_exit_rate": round(counts.get("early_exits", 0) / documents, 4),
            "kept_at_probe_rate": round(counts.get("kept_at_probe", 0) / documents, 4),
            "layer_compute_saved": round(counts.get("layer_compute_saved", 0.0) / documents, 4),
            # What this run changed among documents decided before (new heads or thresholds), by why.
            "old_decisions_decided_again": sum(run.counts_run.get("decided_again", {}).values()),
            "old_decisions_changed": sum(run.counts_run.get("decisions_changed", {}).values()),
            "old_decisions_changed_by_why": dg.MetadataValue.json(
                run.counts_run.get("decisions_changed", {})
            ),
        },
    )
    target, tolerance = settings.keep_rate, settings.keep_rate_tolerance
    off_target = keep_rate_violation(
        source, counts.get("kept", 0), counts.get("documents", 0), target, tolerance
    )
    on_target = problems_result(
        KEEP_RATE,
        [off_target] if off_target else [],
        {"kept_rate": round(kept_rate, 4), "target": target, "tolerance": tolerance},
    )
    return dg.MaterializeResult(metadata=result.metadata, check_results=[*result.check_results, on_target])
