"""Which assets need materialising: missing or stale ones, by Dagster's data-version rules, plus new shards.

Dagster calls an asset (partition) stale when its code version changed since it was built, or an
upstream's data version did (see `moe_dag/orchestration/automation.py` for what the versions are made
of). A root asset has no upstream: `raw_documents` of a source also needs a run when the shard ledger
finds new, changed or removed shards under the source's location.

Dagster exposes stale status publicly only in the UI and GraphQL ("Materialize stale and missing"); this
module uses the resolver behind them, through `dagster_internals`. What it adds, Dagster cannot express:
a code version is per asset, not per partition (a source's own settings, recorded as a run tag), a root
asset has no upstream to see new shards through, and no condition reads another asset's metadata (the
refresh policies' populations, `dedup_clusters`' per-source cluster versions).
"""

from __future__ import annotations

import json

import dagster as dg

from moe_dag.assets.dagster_internals import StaleStatus, stale_status_resolver
from moe_dag.assets.dedup import VERSIONS
from moe_dag.assets.operating import operation
from moe_dag.config import PipelineConfig
from moe_dag.curation.dedup import CLUSTER_VERSION
from moe_dag.engine.shard_ledger import LedgerChanges, ShardLedger, ledger_path, scan_shards
from moe_dag.engine.shards import damaged_outputs
from moe_dag.operations.refresh import Refresh, moved_sources, refresh_waiting
from moe_dag.orchestration.automation import (
    TAG_POPULATION,
    TAG_SOURCE_CONFIG,
    source_config_version,
)
from moe_dag.storage.lake import Lake


class Staleness:
    """Answers for the instance's state at the time of asking: build one after each run."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        definitions: dg.Definitions,
        config: PipelineConfig,
        *,
        refresh: bool = False,
    ):
        """`refresh`: on-demand assets follow new upstream data at once, as if their policy said so."""
        self.resolver = stale_status_resolver(instance, definitions)
        self.instance, self.config, self.refresh = instance, config, refresh
        self.lake = Lake(config.lake_root)
        self.specs = {spec.key: spec for asset in definitions.assets for spec in asset.specs}
        self.graph = definitions.resolve_asset_graph()
        # Assets whose policy found a refresh due that waits for the user (`RefreshConfig.asks_first`),
        # with what to tell them: filled by `reason`, which returns None for them.
        self.waiting: dict[str, str] = {}

    def reason(self, asset: str, partition: str | None) -> str | None:
        """Why `asset` (partition) needs a run ("missing", "stale: ...", "new shards: ..."), or None."""
        key = dg.AssetKey(asset)
        status = self.resolver.get_status(key, partition)
        if status == StaleStatus.MISSING:
            return "missing"
        if status == StaleStatus.STALE and not self._same_clusters_for_source(asset, partition):
            causes = self.resolver.get_stale_root_causes(key, partition)
            return self._by_policy(key, causes)
        if partition is not None and (damage := self._damaged(asset, partition)):
            return damage
        if partition is not None and self._source_settings_changed(key, partition):
            return f"stale: the settings of source {partition!r} that {asset} reads changed"
        if asset == "raw_documents" and partition is not None:
            changes = shard_changes(self.config, partition)
            return f"shards: {changes.describe()}" if changes else None
        return None

    def _damaged(self, asset: str, partition: str) -> str | None:
        """Files of the partition that its completion records vouch for but that are gone or cut since:
        Dagster's own state knows only that the asset was materialised, not that its files still are."""
        damaged, records = damaged_outputs(self.lake, asset, partition)
        if not damaged:
            return None
        more = f" and {len(damaged) - 1} more" if len(damaged) > 1 else ""
        return (
            f"damaged: {damaged[0]}{more} is missing or changed since its run recorded it "
            f"({len(damaged)} of {records} shards)"
        )

    def _by_policy(self, key: dg.AssetKey, causes: list) -> str | None:
        """Why a stale asset needs a run; None for an on-demand asset stale only through new upstream
        data that its refresh policy does not find enough (`moe_dag/operations/refresh.py`)."""
        stale = "stale: " + "; ".join(sorted({_describe(cause) for cause in causes}))
        refresh = operation(self.specs[key]).refresh
        if refresh is None or self.refresh or any(cause.category.value != "DATA" for cause in causes):
            return stale
        moved = self._moved_population(key.to_user_string(), refresh)
        if moved is None:
            return stale
        if not moved:
            return None
        policy = f"refresh.{refresh.threshold} = {getattr(self.config.refresh, refresh.threshold)}"
        why = f"{refresh.population}'s kept documents moved past {policy}: {', '.join(moved)}"
        if self.config.refresh.asks_first(refresh):
            self.waiting[key.to_user_string()] = self._waiting(key, why)
            return None
        return f"refresh: {why}"

    def _waiting(self, key: dg.AssetKey, why: str) -> str:
        """What a waiting refresh of `key` would redo: it and the global assets below it, down to the
        per-source ones (which it redoes in every source), and how many scored documents may change."""
        below, per_source, frontier = {key}, set(), [key]
        while frontier:
            for child in self.graph.get(frontier.pop()).child_keys - below - per_source:
                if self.graph.get(child).is_partitioned:
                    per_source.add(child)
                else:
                    below.add(child)
                    frontier.append(child)
        in_order = [spec_key.to_user_string() for spec_key in self.specs]
        redo = [name for name in in_order if dg.AssetKey(name) in below]
        redo += [f"then {name} of every source" for name in in_order if dg.AssetKey(name) in per_source]
        scored = {}
        for asset in per_source:
            for source, count in self._counts(asset.to_user_string(), "rows_in").items():
                scored[source] = scored.get(source, 0) + count
        return refresh_waiting(key.to_user_string(), why, redo, scored)

    def population(self, asset: str) -> dict[str, int]:
        """Kept documents per source of a per-source asset, from its partitions' latest materialisations."""
        return self._counts(asset, "kept")

    def _counts(self, asset: str, field: str) -> dict[str, int]:
        """A count per source that the partitions' latest materialisations of `asset` record as `field`."""
        counts = {}
        for source in self.config.source_names:
            value = _latest_metadata(self.instance, asset, source).get(field)
            if value is not None:
                counts[source] = int(value.value)
        return counts

    def _moved_population(self, asset: str, refresh: Refresh) -> list[str] | None:
        """The sources whose population moved past the policy's share since `asset` last ran (None: that
        run recorded no population, so the policy cannot tell)."""
        records = self.instance.fetch_materializations(dg.AssetKey(asset), limit=1).records
        run = self.instance.get_run_by_id(records[0].run_id) if records else None
        built = json.loads(run.tags.get(TAG_POPULATION, "{}")) if run else {}
        if refresh.population not in built:
            return None
        share = getattr(self.config.refresh, refresh.threshold)
        return moved_sources(built[refresh.population], self.population(refresh.population), share)

    def population_tags(self, assets: list[str]) -> dict[str, str]:
        """The run tag recording the populations the on-demand assets among `assets` are built from."""
        watched = {operation(self.specs[dg.AssetKey(a)]).refresh for a in assets} - {None}
        if not watched:
            return {}
        return {TAG_POPULATION: json.dumps({r.population: self.population(r.population) for r in watched})}

    def _source_settings_changed(self, key: dg.AssetKey, source: str) -> bool:
        """Whether the partition was built (by a run that recorded it) from other settings of its source
        than the config's now; per-source settings are not in the asset's code version."""
        records = self.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[source]), limit=1
        ).records
        run = self.instance.get_run_by_id(records[0].run_id) if records else None
        built = json.loads(run.tags.get(TAG_SOURCE_CONFIG, "{}")) if run else {}
        asset = key.to_user_string()
        return asset in built and built[asset] != source_config_version(self.specs[key], self.config, source)

    def _same_clusters_for_source(self, asset: str, partition: str | None) -> bool:
        """A `deduplicated` partition stale only because `dedup_clusters` was rebuilt, while the source's
        own cluster version is the one it was built from: its rows would not change (the rule of the
        `dedup_consistency` sensor, finer than Dagster's, which sees one unpartitioned upstream)."""
        if asset != "deduplicated" or partition is None:
            return False
        causes = self.resolver.get_stale_causes(dg.AssetKey(asset), partition)
        if any(cause.dependency_asset_key != dg.AssetKey("dedup_clusters") for cause in causes):
            return False
        clusters = _latest_metadata(self.instance, "dedup_clusters", None).get(VERSIONS)
        built = _latest_metadata(self.instance, "deduplicated", partition).get(CLUSTER_VERSION)
        return clusters is not None and built is not None and clusters.value.get(partition) == built.value


def _latest_metadata(instance: dg.DagsterInstance, asset: str, partition: str | None) -> dict:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None
        ),
        limit=1,
    ).records
    return dict(records[0].asset_materialization.metadata) if records else {}


def shard_changes(config: PipelineConfig, source: str) -> LedgerChanges:
    """How the source's shard location differs from the ledger."""
    ledger = ShardLedger(ledger_path(config.catalog_path))
    return ledger.changes(source, scan_shards(config.source(source).shards))


def _describe(cause) -> str:
    where = cause.asset_key.to_user_string()
    if cause.partition_key is not None:
        where += f"[{cause.partition_key}]"
    return f"{where} {cause.reason}"
