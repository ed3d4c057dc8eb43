"""quality_heads: distil the oracle's labels into a probe and a judge head on a frozen backbone."""

import dataclasses
import time

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.reporting import problems_result
from moe_dag.assets.resources import PipelineResource
from moe_dag.operations.bounds import calibration_shortfalls, head_agreement_violations
from moe_dag.operations.plots import bars_png, png_markdown, scatter_png
from moe_dag.quality.build_heads import distil_heads, labelled_documents
from moe_dag.quality.oracle import rubric_for_kind
from moe_dag.settings.quality import head_settings

AGREES_WITH_ORACLE = "agrees_with_oracle"
CALIBRATED = "calibrated_on_enough_documents"


@dg.asset(
    group_name="quality",
    kinds={"pytorch", "safetensors"},
    deps=["oracle_labels", "oracle_sample"],
    metadata=operated(1, head_settings),
    pool="gpu",
    check_specs=[
        dg.AssetCheckSpec(
            AGREES_WITH_ORACLE,
            asset="quality_heads",
            blocking=True,
            description="keep-decision F1 of the probe and of the judge against the oracle on the held-out "
            "labels is at least checks.min_head_f1 (blocking: heads that disagree with the oracle would "
            "spend the scoring of every document on wrong decisions)",
        ),
        dg.AssetCheckSpec(
            CALIBRATED,
            asset="quality_heads",
            description="every source's thresholds were calibrated on as many unseen documents as a keep "
            "rate within calibration.keep_rate_tolerance needs (a warning: on fewer, its keep rate on new "
            "documents may miss its target by more; the check says by how much)",
        ),
    ],
)
def quality_heads(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Probe and judge heads predicting every rubric dimension, and per-source thresholds.

    The thresholds are calibrated on documents the heads never trained on (held-out labels and the
    calibration sample). The heads' version is this asset's data version: `scored_documents` is
    rescored when it changes.
    """
    settings, lake = head_settings(pipeline.config), pipeline.lake
    started = time.perf_counter()
    with lake.writing_artifact("quality_heads") as heads_dir:
        heads = distil_heads(
            labelled_documents(lake.read_table("oracle_labels"), lake.read_table("oracle_sample")),
            lake.read_table("calibration_sample"),
            heads_dir,
            rubrics={name: rubric_for_kind(kind).name for name, kind in settings.kinds.items()},
            keep_rates=settings.keep_rates,
            backbone_config=settings.backbone,
            train_config=settings.heads,
            calibration_config=settings.calibration,
        )
    metrics, heldout = heads.metrics, heads.heldout
    stored_thresholds = {source: dataclasses.asdict(t) for source, t in heads.thresholds.items()}
    calibration = settings.calibration
    for warning in heads.calibration_warnings:
        context.log.warning(f"quality_heads calibration: {warning}")
    context.log.info(
        f"heads {heads.version}: judge F1 {metrics['judge_f1']:.3f}, probe F1 {metrics['probe_f1']:.3f}"
    )
    dimensions = sorted(k.removeprefix("judge_spearman_") for k in metrics if k.startswith("judge_spearman_"))
    spearman_plot = bars_png(
        dimensions,
        {head: [metrics[f"{head}_spearman_{dim}"] for dim in dimensions] for head in ("probe", "judge")},
        "Spearman vs oracle",
        "per rubric dimension, held-out labels",
    )
    scatter = scatter_png(
        heldout.oracle.tolist(), heldout.judge.tolist(), "oracle", "judge", "keep aggregate"
    )
    return dg.MaterializeResult(
        metadata={
            "version": heads.version,
            "labelled_documents": heads.labelled_documents,
            **{name: round(value, 4) for name, value in metrics.items()},
            "thresholds": dg.MetadataValue.json(stored_thresholds),
            "calibration_warnings": dg.MetadataValue.json(heads.calibration_warnings),
            "dimension_agreement": dg.MetadataValue.md(png_markdown(spearman_plot, "Spearman per dimension")),
            "judge_vs_oracle": dg.MetadataValue.md(
                png_markdown(scatter, "judge vs oracle on held-out labels")
            ),
            "seconds": round(time.perf_counter() - started, 2),
        },
        data_version=dg.DataVersion(heads.version),
        check_results=[
            problems_result(
                AGREES_WITH_ORACLE,
                head_agreement_violations(metrics, settings.checks),
                {f"{head}_f1": round(metrics[f"{head}_f1"], 4) for head in ("probe", "judge")},
            ),
            problems_result(
                CALIBRATED,
                calibration_shortfalls(
                    stored_thresholds, settings.keep_rates, calibration.keep_rate_tolerance, calibration.z
                ),
                {
                    "unseen_documents": dg.MetadataValue.json(
                        {source: t.n_calibration for source, t in heads.thresholds.items()}
                    )
                },
            ),
        ],
    )
