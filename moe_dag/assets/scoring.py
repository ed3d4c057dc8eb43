"""scored_documents: the probe then (for documents that stay) the judge, with early exit."""

import time

import dagster as dg

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import decision_result, reconcile_check_spec
from moe_dag.data.heads import load_backbone, load_heads
from moe_dag.data.schema import kept_rows
from moe_dag.data.scoring import early_exit_summary, score_documents
from moe_dag.resources import PipelineResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="quality",
    kinds={"pytorch", "parquet"},
    deps=["toxicity_filtered", "quality_heads"],
    pool="gpu",
    check_specs=[reconcile_check_spec("scored_documents")],
)
def scored_documents(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    source = context.partition_key
    lake = pipeline.lake
    documents = kept_rows(lake.read_table("toxicity_filtered", source))
    stored = load_heads(lake.artifact_dir("quality_heads"))
    backbone = load_backbone(stored.backbone_config)
    started = time.perf_counter()
    scored = score_documents(
        documents, backbone, stored.heads, stored.thresholds[source], stored.backbone_config.batch_size
    )
    lake.write_table(scored, "scored_documents", source)
    exits = early_exit_summary(scored, stored.backbone_config)
    return decision_result(
        scored,
        documents.num_rows,
        time.perf_counter() - started,
        extra={
            "heads_version": stored.version,
            "early_exit_rate": round(exits["early_exit_rate"], 4),
            "layer_compute_saved": round(exits["layer_compute_saved"], 4),
        },
    )
