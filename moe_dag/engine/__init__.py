"""The data plane: per-source stages over shards, on Ray (local or a cluster) or in this process."""

from moe_dag.engine.cluster import RayConfig, connect
from moe_dag.engine.run import ShardStageError, StageRun, run_stage
from moe_dag.engine.shards import ShardInput, raw_shard_inputs, shard_key, upstream_inputs
from moe_dag.engine.stage import ShardOutput, ShardWork, StageSpec, merge_counts, process_shard

__all__ = [
    "RayConfig",
    "ShardInput",
    "ShardOutput",
    "ShardStageError",
    "ShardWork",
    "StageRun",
    "StageSpec",
    "connect",
    "merge_counts",
    "process_shard",
    "raw_shard_inputs",
    "run_stage",
    "shard_key",
    "upstream_inputs",
]
