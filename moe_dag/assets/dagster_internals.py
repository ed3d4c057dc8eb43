"""The one place moe-dag touches Dagster's private modules, and the version they were checked against.

Dagster exposes some of what an operator needs only through its UI and GraphQL: the stale-status
resolver behind "Materialize stale and missing", the launcher class that tells local runs from
Kubernetes ones, and the error a failed Pipes process raises. Each private name is imported here and
nowhere else, so a Dagster upgrade that moves one breaks this module (and its test, which pins the
series below) instead of a run in production.
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.data_version import (
    CachingStaleStatusResolver,
    StaleStatus,
    extract_data_version_from_entry,
)

# Raised by PipesSubprocessClient when the process exits non-zero; Dagster exports it from here only.
from dagster._core.errors import DagsterAssetCheckFailedError, DagsterPipesExecutionError
from dagster._core.launcher import DefaultRunLauncher
from dagster._time import get_current_datetime

# The Dagster release series these private names were read from; tests/test_dagster_internals.py fails
# on another series, so an upgrade re-checks each name here before it lands.
CHECKED_DAGSTER_SERIES = "1.13"

PARTITION_TAG = "dagster/partition"  # the partition key of a run launched for one partition
HISTORY_PAGE = 200  # check executions read at a time, newest first

__all__ = [
    "CHECKED_DAGSTER_SERIES",
    "DagsterAssetCheckFailedError",
    "DagsterPipesExecutionError",
    "input_data_versions",
    "StaleStatus",
    "latest_check_evaluations",
    "launches_local_processes",
    "stale_status_resolver",
]


def stale_status_resolver(
    instance: dg.DagsterInstance, definitions: dg.Definitions
) -> CachingStaleStatusResolver:
    """Dagster's resolver of missing / stale status of every asset (partition) of `definitions`, now."""
    graph = definitions.resolve_asset_graph()
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    return CachingStaleStatusResolver(instance, graph, view)


def input_data_versions(instance: dg.DagsterInstance, inputs: Iterable[dg.AssetKey]) -> dict[str, str | None]:
    """The data version of each of `inputs`' latest materialization (None: never materialised), as
    Dagster records them: what an asset that reads them now was computed from. A partitioned input gives
    its latest materialization of any partition (the training assets' inputs are unpartitioned)."""
    versions = {}
    for key in sorted(inputs, key=lambda k: k.to_user_string()):
        record = instance.get_latest_data_version_record(key)
        version = extract_data_version_from_entry(record.event_log_entry) if record else None
        versions[key.to_user_string()] = version.value if version else None
    return versions


def launches_local_processes(instance: dg.DagsterInstance) -> bool:
    """Whether the instance runs each run as a local process (the default launcher), whose liveness this
    machine can judge; a Kubernetes or other launcher has its own health checks."""
    return isinstance(instance.run_launcher, DefaultRunLauncher)


def latest_check_evaluations(
    instance: dg.DagsterInstance, checks: list[dg.AssetCheckKey], partition: str | None
) -> dict[dg.AssetCheckKey, dg.AssetCheckEvaluation]:
    """The latest evaluation of each check, among the runs of `partition` when it is given; checks
    never evaluated there are absent.

    Dagster 1.13 records checks of a partitioned asset without their partition (the record's and the
    evaluation's are None), so the partition is the one of the run that evaluated the check.
    """
    storage, run_partitions = instance.event_log_storage, {}

    def run_partition(run_id: str) -> str | None:
        if run_id not in run_partitions:
            run = instance.get_run_by_id(run_id)
            run_partitions[run_id] = run.tags.get(PARTITION_TAG) if run else None
        return run_partitions[run_id]

    evaluations = {}
    for key in checks:
        cursor = None
        while key not in evaluations:
            records = storage.get_asset_check_execution_history(key, limit=HISTORY_PAGE, cursor=cursor)
            for record in records:
                event = record.event.dagster_event if record.event else None
                evaluation = event.event_specific_data if event else None
                if isinstance(evaluation, dg.AssetCheckEvaluation) and (
                    partition is None or run_partition(record.run_id) == partition
                ):
                    evaluations[key] = evaluation
                    break
            if len(records) < HISTORY_PAGE:
                break
            cursor = records[-1].id
    return evaluations
