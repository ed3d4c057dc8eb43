"""Exact and MinHash near-duplicate removal: signatures -> clusters -> keep/reason per document."""

from moe_dag.data.dedup.clusters import CLUSTER_SCHEMA, apply_dedup, find_duplicate_clusters
from moe_dag.data.dedup.minhash import (
    SIGNATURE_SCHEMA,
    MinHashConfig,
    candidate_probability,
    compute_signatures,
)

__all__ = [
    "CLUSTER_SCHEMA",
    "SIGNATURE_SCHEMA",
    "MinHashConfig",
    "apply_dedup",
    "candidate_probability",
    "compute_signatures",
    "find_duplicate_clusters",
]
