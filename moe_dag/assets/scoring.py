"""scored_documents: the probe then (for documents that stay) the judge, with early exit.

Rescoring: `quality_heads` records the heads' version as its data version, and this asset's automation
condition requests every source partition when that version changes (once the daemon's default
automation sensor is on). Rows the current heads already scored are reused, not scored again, so a
rerun with unchanged heads costs nothing but the read. The weekly schedule in `definitions.py` stays.
"""

import time

import dagster as dg
import pyarrow as pa

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import decision_result, reconcile_check_spec
from moe_dag.data.heads import load_backbone, load_heads
from moe_dag.data.schema import kept_rows
from moe_dag.data.scoring import early_exit_summary, score_documents, split_reusable
from moe_dag.resources import PipelineResource

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
    kinds={"pytorch", "parquet"},
    deps=["toxicity_filtered", "quality_heads"],
    pool="gpu",
    automation_condition=RESCORE_ON_NEW_HEADS,
    check_specs=[
        reconcile_check_spec("scored_documents"),
        dg.AssetCheckSpec(
            KEEP_RATE,
            asset="scored_documents",
            description="the kept share is within the calibration tolerance of the source's keep rate",
        ),
    ],
)
def scored_documents(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    source, lake, config = context.partition_key, pipeline.lake, pipeline.config
    documents = kept_rows(lake.read_table("toxicity_filtered", source))
    stored = load_heads(lake.artifact_dir("quality_heads"))
    if source not in stored.thresholds:
        raise dg.Failure(
            f"heads {stored.version} have no thresholds for source {source!r}; see quality_heads"
        )
    thresholds = stored.thresholds[source]
    previous = (
        lake.read_table("scored_documents", source) if lake.has_table("scored_documents", source) else None
    )
    started = time.perf_counter()
    reused, todo = split_reusable(documents, previous, stored.version, thresholds)
    parts = [] if reused is None else [reused]
    if todo.num_rows or not parts:  # the backbone loads only when something needs scoring
        backbone = load_backbone(stored.backbone_config)
        parts.append(
            score_documents(todo, backbone, stored.heads, thresholds, stored.backbone_config.batch_size)
        )
    scored = pa.concat_tables(parts, promote_options="permissive")
    lake.write_table(scored, "scored_documents", source)
    exits = early_exit_summary(scored, stored.backbone_config)
    target, tolerance = config.source(source).keep_rate, config.calibration.keep_rate_tolerance
    result = decision_result(
        scored,
        documents.num_rows,
        time.perf_counter() - started,
        extra={
            "heads_version": stored.version,
            "reused_scores": 0 if reused is None else reused.num_rows,
            "scored_now": todo.num_rows,
            "early_exit_rate": round(exits["early_exit_rate"], 4),
            "layer_compute_saved": round(exits["layer_compute_saved"], 4),
        },
    )
    on_target = dg.AssetCheckResult(
        check_name=KEEP_RATE,
        passed=bool(abs(exits["kept_rate"] - target) <= tolerance),
        metadata={"kept_rate": round(exits["kept_rate"], 4), "target": target, "tolerance": tolerance},
    )
    return dg.MaterializeResult(metadata=result.metadata, check_results=[*result.check_results, on_target])
