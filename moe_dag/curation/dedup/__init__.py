"""Exact and MinHash near-duplicate removal: signatures -> clusters -> keep/reason per document."""

from moe_dag.curation.dedup.clusters import (
    CLUSTER_SCHEMA,
    CLUSTER_VERSION,
    ShardClusters,
    apply_dedup,
    band_pairs,
    built_from_version,
    cluster_versions,
    combine_versions,
    find_duplicate_clusters,
    shard_cluster_version,
    signature_rows,
)
from moe_dag.curation.dedup.minhash import (
    SIGNATURE_SCHEMA,
    MinHashConfig,
    candidate_probability,
    compute_signatures,
)
from moe_dag.curation.dedup.partitioned import cluster_partitioned
from moe_dag.curation.dedup.shingles import normalize_text, shingle_hashes

__all__ = [
    "CLUSTER_SCHEMA",
    "CLUSTER_VERSION",
    "SIGNATURE_SCHEMA",
    "ShardClusters",
    "MinHashConfig",
    "apply_dedup",
    "band_pairs",
    "built_from_version",
    "candidate_probability",
    "cluster_partitioned",
    "cluster_versions",
    "combine_versions",
    "compute_signatures",
    "find_duplicate_clusters",
    "normalize_text",
    "shard_cluster_version",
    "shingle_hashes",
    "signature_rows",
]
