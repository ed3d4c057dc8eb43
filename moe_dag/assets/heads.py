"""quality_heads: distil the oracle's labels into a probe and a judge head on a frozen backbone."""

import dataclasses
import time

import dagster as dg

from moe_dag.assets.plots import png_markdown, scatter_png
from moe_dag.data.heads import calibrate_thresholds, load_backbone, save_heads, train_heads
from moe_dag.resources import PipelineResource


@dg.asset(
    group_name="quality",
    kinds={"pytorch", "safetensors"},
    deps=["oracle_labels", "oracle_sample"],
    pool="gpu",
)
def quality_heads(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Probe and judge heads, and per-source thresholds calibrated on held-out oracle labels."""
    config = pipeline.config
    lake = pipeline.lake
    labels = lake.read_table("oracle_labels").select(["id", "quality"])
    sample = lake.read_table("oracle_sample").select(["id", "text", "source"])
    labelled = sample.join(labels, "id", join_type="inner").sort_by("id")
    started = time.perf_counter()
    backbone = load_backbone(config.backbone)
    trained = train_heads(
        backbone,
        labelled["text"].to_pylist(),
        labelled["quality"].to_pylist(),
        labelled["source"].to_pylist(),
        config.heads,
    )
    heldout = trained.heldout
    thresholds = calibrate_thresholds(
        heldout.probe,
        heldout.judge,
        heldout.sources,
        {s.name: s.keep_rate for s in config.sources},
        **dataclasses.asdict(config.calibration),
    )
    version = save_heads(
        lake.artifact_dir("quality_heads"), trained.heads, thresholds, config.backbone, trained.metrics
    )
    context.log.info(f"heads {version}: {trained.metrics}")
    plot = scatter_png(
        heldout.oracle.tolist(), heldout.judge.tolist(), "oracle quality", "judge score", "held-out labels"
    )
    return dg.MaterializeResult(
        metadata={
            "version": version,
            "labelled_documents": labelled.num_rows,
            **{name: round(value, 4) for name, value in trained.metrics.items()},
            "thresholds": dg.MetadataValue.json(
                {source: dataclasses.asdict(t) for source, t in thresholds.items()}
            ),
            "judge_vs_oracle": dg.MetadataValue.md(png_markdown(plot, "judge vs oracle on held-out labels")),
            "seconds": round(time.perf_counter() - started, 2),
        }
    )
