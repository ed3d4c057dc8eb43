"""Near-duplicate removal: MinHash signatures per source, clusters across all sources, then the cut."""

import functools
import time

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import (
    decision_result,
    engine_metadata,
    kept_upstream,
    reconcile_check_spec,
    run_source_stage,
)
from moe_dag.data.dedup import find_duplicate_clusters
from moe_dag.data.engine import StageSpec
from moe_dag.data.engine.stages import DedupWork, SignatureWork
from moe_dag.resources import PipelineResource, RayResource


@dg.asset(partitions_def=PER_SOURCE, group_name="curation", kinds={"parquet", "ray"}, deps=["prefiltered"])
def minhash_signatures(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Exact-content hash and MinHash signature of every document the prefilter kept, one file per shard."""
    config = pipeline.config.dedup
    spec = StageSpec(
        outputs=("minhash_signatures",),
        make_work=functools.partial(SignatureWork, config),
        params=repr(config),
    )
    run = run_source_stage(context, pipeline, ray, spec, "prefiltered")
    documents = run.counts.get("documents", 0)
    return dg.MaterializeResult(
        metadata={"documents": documents, "dagster/row_count": documents, **engine_metadata(run)}
    )


@dg.asset(
    group_name="curation",
    kinds={"duckdb", "parquet"},
    deps=["minhash_signatures"],
    check_specs=[dg.AssetCheckSpec("one_row_per_document", asset="dedup_clusters", blocking=True)],
)
def dedup_clusters(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Duplicate clusters across every source, one deterministic survivor each."""
    config = pipeline.config
    signatures = pa.concat_tables(
        [pipeline.lake.read_table("minhash_signatures", name) for name in config.source_names]
    )
    started = time.perf_counter()
    clusters = find_duplicate_clusters(signatures, config.dedup, source_priority=config.source_names)
    pipeline.lake.write_table(clusters, "dedup_clusters")
    duplicates = clusters.filter(pc.invert(clusters["is_survivor"]))
    survivor_source = dict(zip(clusters["id"].to_pylist(), clusters["source"].to_pylist(), strict=True))
    cross_source = sum(
        survivor_source[row["cluster_id"]] != row["source"]
        for row in duplicates.select(["source", "cluster_id"]).to_pylist()
    )
    by_match = {m["values"]: m["counts"] for m in pc.value_counts(duplicates["match"]).to_pylist()}
    context.log.info(f"{duplicates.num_rows} duplicates among {clusters.num_rows} documents")
    unique_ids = pc.count_distinct(clusters["id"]).as_py()
    return dg.MaterializeResult(
        metadata={
            "documents": clusters.num_rows,
            "duplicates": duplicates.num_rows,
            "exact_duplicates": by_match.get("exact", 0),
            "near_duplicates": by_match.get("near", 0),
            "cross_source_duplicates": cross_source,
            "clusters_with_duplicates": pc.count_distinct(duplicates["cluster_id"]).as_py(),
            "seconds": round(time.perf_counter() - started, 2),
            "dagster/row_count": clusters.num_rows,
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="one_row_per_document",
                passed=unique_ids == signatures.num_rows == clusters.num_rows,
                metadata={"signatures": signatures.num_rows, "cluster_rows": clusters.num_rows},
            )
        ],
    )


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet"},
    deps=["prefiltered", "dedup_clusters"],
    check_specs=[reconcile_check_spec("deduplicated")],
)
def deduplicated(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """The source's prefiltered documents with every non-survivor of a duplicate cluster dropped."""
    source = context.partition_key
    spec = StageSpec(
        outputs=("deduplicated",),
        make_work=functools.partial(DedupWork, pipeline.lake.url, source),
        # New clusters (any source backfilled) redo every shard.
        params=pipeline.lake.fingerprint("dedup_clusters"),
        actor_pool=True,  # the cluster table loads once per actor
    )
    run = run_source_stage(context, pipeline, ray, spec, "prefiltered")
    return decision_result(run, kept_upstream(pipeline, "prefiltered", source))
