"""Near-duplicate removal: MinHash signatures per source, clusters across all sources, then the cut."""

import time

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import decision_result, reconcile_check_spec
from moe_dag.data.dedup import apply_dedup, compute_signatures, find_duplicate_clusters
from moe_dag.data.schema import kept_rows
from moe_dag.resources import PipelineResource


@dg.asset(partitions_def=PER_SOURCE, group_name="curation", kinds={"parquet"}, deps=["prefiltered"])
def minhash_signatures(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Exact-content hash and MinHash signature of every document the prefilter kept."""
    source = context.partition_key
    documents = kept_rows(pipeline.lake.read_table("prefiltered", source))
    started = time.perf_counter()
    signatures = compute_signatures(documents, pipeline.config.dedup)
    pipeline.lake.write_table(signatures, "minhash_signatures", source)
    seconds = time.perf_counter() - started
    return dg.MaterializeResult(
        metadata={
            "documents": signatures.num_rows,
            "seconds": round(seconds, 2),
            "documents_per_second": round(signatures.num_rows / max(seconds, 1e-9), 1),
            "dagster/row_count": signatures.num_rows,
        }
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
def deduplicated(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The source's prefiltered documents with every non-survivor of a duplicate cluster dropped."""
    source = context.partition_key
    documents = kept_rows(pipeline.lake.read_table("prefiltered", source))
    started = time.perf_counter()
    clusters = pipeline.lake.read_table("dedup_clusters")
    table = apply_dedup(documents, clusters.filter(pc.equal(clusters["source"], source)))
    pipeline.lake.write_table(table, "deduplicated", source)
    return decision_result(table, documents.num_rows, time.perf_counter() - started)
