"""scored_documents: the probe then (for documents that stay) the judge, with early exit."""

import functools

import dagster as dg

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import decision_result, kept_upstream, reconcile_check_spec, run_source_stage
from moe_dag.data.engine import StageSpec
from moe_dag.data.engine.stages import ScoringWork
from moe_dag.data.heads import load_heads
from moe_dag.resources import PipelineResource, RayResource


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="quality",
    kinds={"pytorch", "parquet", "ray"},
    deps=["toxicity_filtered", "quality_heads"],
    pool="gpu",
    check_specs=[reconcile_check_spec("scored_documents")],
)
def scored_documents(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    source = context.partition_key
    heads_dir = pipeline.lake.artifact_dir("quality_heads")
    stored = load_heads(heads_dir)
    spec = StageSpec(
        outputs=("scored_documents",),
        make_work=functools.partial(ScoringWork, str(heads_dir), source),
        # A new heads version or new thresholds rescore every shard.
        params=repr((stored.version, stored.thresholds[source])),
        actor_pool=True,  # backbone and heads load once per actor
        num_gpus=ray.scoring_gpus,
    )
    run = run_source_stage(context, pipeline, ray, spec, "toxicity_filtered")
    counts = run.counts
    documents = max(counts.get("documents", 0), 1)
    return decision_result(
        run,
        kept_upstream(pipeline, "toxicity_filtered", source),
        {
            "heads_version": stored.version,
            "early_exit_rate": round(counts.get("early_exits", 0) / documents, 4),
            "layer_compute_saved": round(counts.get("layer_compute_saved", 0.0) / documents, 4),
        },
    )
