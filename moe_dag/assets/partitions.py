"""The one partitions definition shared by every per-source asset: one partition per data source.

Per-source assets declare `partitions_def=PER_SOURCE`, a placeholder: the source names come from the
pipeline config, and the config is read when the definitions are built (`bind_source_partitions`), never
when a module is imported, so `import moe_dag.orchestration.definitions` works from any folder.

Never one partition per shard file: Dagster slows down past a few thousand partitions, so a partition
fans out over its shards inside the run instead.
"""

from collections.abc import Sequence

import dagster as dg

PER_SOURCE = dg.StaticPartitionsDefinition(["<bound to the config's sources when definitions load>"])


def bind_source_partitions(
    assets: Sequence[dg.AssetsDefinition], source_names: Sequence[str]
) -> tuple[dg.StaticPartitionsDefinition, list[dg.AssetsDefinition]]:
    """The config's partitions definition, and `assets` with every `PER_SOURCE` placeholder replaced."""
    partitions = dg.StaticPartitionsDefinition(list(source_names))

    def bind(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.partitions_def is PER_SOURCE:
            return spec.replace_attributes(partitions_def=partitions)
        return spec

    return partitions, [asset.map_asset_specs(bind) for asset in assets]
