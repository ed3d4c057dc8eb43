"""Keeping a local Dagster instance unstuck: runs whose process is gone, and the pool slots they hold.

A run killed with SIGKILL never records its end: it stays STARTED, and the pool slot its step claimed
(`gpu`, `duckdb_catalog`, both limited to 1) stays claimed, so every later run waits at its first pooled
asset for ever. Dagster's run monitoring frees slots of runs that have *ended*
(`free_slots_after_run_end_seconds` in dagster.yaml) but cannot tell that a local run worker died. Every
run records the pids of the processes that execute its steps (engine events); a run whose every recorded
process is gone is dead: it is marked failed and its slots are freed.

This applies to instances that launch runs as local processes (the default launcher, and
`dagster.materialize` in process). A Kubernetes deployment relies on its run launcher's health checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dagster as dg

from moe_dag.orchestration.dagster_internals import launches_local_processes

ACTIVE_STATUSES = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class PoolHolder:
    pool: str
    run_id: str
    step_key: str
    run_status: str

    def describe(self) -> str:
        return f"pool {self.pool!r} is held by run {self.run_id} (step {self.step_key}, {self.run_status})"


def free_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark runs whose processes are gone as failed and free every slot held by a run that has ended.

    Returns one line per run freed. Safe to call at any time: live runs are left alone.
    """
    if not launches_local_processes(instance):
        return []
    freed = []
    storage = instance.event_log_storage
    for run in instance.get_runs(dg.RunsFilter(statuses=ACTIVE_STATUSES)):
        pids = worker_pids(instance, run.run_id)
        if pids and not any(process_alive(pid) for pid in pids):
            message = f"run worker process(es) {sorted(pids)} are gone (killed?): marked failed by moe-dag"
            instance.report_run_failed(run, message)
            storage.free_concurrency_slots_for_run(run.run_id)
            freed.append(f"run {run.run_id} ({run.job_name}): {message}; its pool slots are free")
    for pool in storage.get_concurrency_keys():
        for run_id in {slot.run_id for slot in storage.get_concurrency_info(pool).claimed_slots}:
            run = instance.get_run_by_id(run_id)
            if run is None or run.is_finished:
                storage.free_concurrency_slots_for_run(run_id)
                freed.append(f"pool {pool!r}: freed the slot of run {run_id}, which has ended")
    return freed


def pool_holders(instance: dg.DagsterInstance, pools: set[str]) -> list[PoolHolder]:
    """Who holds the slots of `pools` that are full now (empty when a new step would start at once)."""
    holders = []
    storage = instance.event_log_storage
    for pool in sorted(pools):
        info = storage.get_concurrency_info(pool)
        if info.limit is None or len(info.claimed_slots) < info.limit:
            continue
        for slot in info.claimed_slots:
            run = instance.get_run_by_id(slot.run_id)
            status = run.status.value if run else "unknown run"
            holders.append(PoolHolder(pool, slot.run_id, slot.step_key, status))
    return holders


def worker_pids(instance: dg.DagsterInstance, run_id: str) -> set[int]:
    """Pids of the processes that executed the run's steps, from its engine events."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
    pids = set()
    for record in records:
        event = record.event_log_entry.dagster_event
        metadata = getattr(event.event_specific_data, "metadata", None) or {}
        if "pid" in metadata:
            pids.add(int(metadata["pid"].value))
    return pids


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return True
