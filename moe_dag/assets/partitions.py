"""The one partitions definition shared by every per-source asset: one partition per data source.

Never one partition per shard file: Dagster slows down past a few thousand partitions, so a partition
fans out over its shards inside the run instead.
"""

import dagster as dg

from moe_dag.config import config_path_from_env, load_config

SOURCE_PARTITIONS = dg.StaticPartitionsDefinition(load_config(config_path_from_env()).source_names)
