"""Keeping a local Dagster instance unstuck: runs whose process is gone, and the pool slots they hold.

A run killed with SIGKILL never records its end: it stays STARTED, and the pool slot its step claimed
(`gpu`, `duckdb_catalog`, both limited to 1) stays claimed, so every later run waits at its first pooled
asset for ever. Dagster's run monitoring frees slots of runs that have *ended*
(`free_slots_after_run_end_seconds` in dagster.yaml) but cannot tell that a local run worker died. Every
run records the pids of the processes that execute its steps (engine events, each with its time), and
the pipeline resource tags the run with the host and PID namespace those pids belong to
(`RUN_HOST_TAG`). A run is judged only from that same host and namespace, never by a bare pid: a
recorded process counts as alive when a process with its pid exists here and started before the event
that named it (a pid reused since the kill belongs to a younger process). A run whose every recorded
process is gone is dead: it is marked failed and its slots are freed. A run tagged with another host or
namespace, or with none, is left for whoever can see its processes.

This applies to instances that launch runs as local processes (the default launcher, and
`dagster.materialize` in process). A Kubernetes deployment relies on its run launcher's health checks.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from moe_dag.assets.dagster_internals import launches_local_processes
from moe_dag.assets.run_identity import RUN_HOST_TAG, pid_namespace

# /proc gives a process's start to the clock tick and the boot time to the second.
START_SLACK_S = 2.0
# Every stage takes the pipeline resource, which tags its run within seconds of the step's start, just
# after the step claims its pool slot. A run that holds a slot this long after it started and is still
# untagged died between the two (or is no run of moe-dag's): nothing else would ever free its slot.
UNTAGGED_GRACE_S = 300.0

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

    Returns one line per run freed. Safe to call at any time, from anywhere: live runs are left alone,
    and so are runs this process cannot see (another host or PID namespace).
    """
    if not launches_local_processes(instance):
        return []
    freed = []
    storage = instance.event_log_storage
    here = pid_namespace()
    holders = {
        slot.run_id: pool for pool in storage.get_concurrency_keys() for slot in _claimed(instance, pool)
    }
    for run in instance.get_runs(dg.RunsFilter(statuses=ACTIVE_STATUSES)):
        if RUN_HOST_TAG not in run.tags and run.run_id in holders and _started_before_grace(instance, run):
            message = (
                f"holds pool {holders[run.run_id]!r} but never recorded where its processes run (killed "
                f"before its resources were set up?), {UNTAGGED_GRACE_S:.0f} s after it started: marked "
                "failed by moe-dag"
            )
            instance.report_run_failed(run, message)
            storage.free_concurrency_slots_for_run(run.run_id)
            freed.append(f"run {run.run_id} ({run.job_name}): {message}; its pool slots are free")
            continue
        if run.tags.get(RUN_HOST_TAG) != here:
            continue
        processes = worker_processes(instance, run.run_id)
        if processes and not any(alive_since(pid, named_at) for pid, named_at in processes.items()):
            message = (
                f"run worker process(es) {sorted(processes)} are gone (killed?): marked failed by moe-dag"
            )
            instance.report_run_failed(run, message)
            storage.free_concurrency_slots_for_run(run.run_id)
            freed.append(f"run {run.run_id} ({run.job_name}): {message}; its pool slots are free")
    for pool in storage.get_concurrency_keys():
        for run_id in {slot.run_id for slot in _claimed(instance, pool)}:
            run = instance.get_run_by_id(run_id)
            if run is None or run.is_finished:
                storage.free_concurrency_slots_for_run(run_id)
                freed.append(f"pool {pool!r}: freed the slot of run {run_id}, which has ended")
    return freed


def _claimed(instance: dg.DagsterInstance, pool: str) -> list:
    return instance.event_log_storage.get_concurrency_info(pool).claimed_slots


def _started_before_grace(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    record = instance.get_run_record_by_id(run.run_id)
    started = record.start_time if record is not None and record.start_time else None
    return started is not None and time.time() - started >= UNTAGGED_GRACE_S


# Dagster commands that execute steps in their own process, with no daemon to run the reaper sensor.
DAEMONLESS_COMMANDS = (("asset", "materialize"), ("job", "execute"))


def unstick_daemonless_command(
    instance: dg.DagsterInstance, argv: Sequence[str], log: Callable[[str], None]
) -> None:
    """Before `dagster asset materialize` runs (no daemon, so no reaper sensor): free what dead runs
    hold, and say who holds each full pool and how to free it, since Dagster itself only logs
    "Step still blocked by limit for pool" at DEBUG and waits for ever."""
    if Path(argv[0]).name != "dagster" or tuple(argv[1:3]) not in DAEMONLESS_COMMANDS:
        return
    if multiprocessing.parent_process() is not None:  # a step's process, given its parent's argv
        return
    for line in free_dead_runs(instance):
        log(f"moe-dag freed: {line}")
    pools = set(instance.event_log_storage.get_concurrency_keys())
    for holder in pool_holders(instance, pools):
        log(
            f"moe-dag: {holder.describe()}; a step of this materialisation that needs pool "
            f"{holder.pool!r} waits until that run ends. If it is dead, `moe-dag free-stuck-runs` (run "
            f"where it runs) frees the pool; else wait, or end it: dagster run delete {holder.run_id}"
        )
    for line in runs_seen_elsewhere(instance):
        log(f"moe-dag: {line}")


def runs_seen_elsewhere(instance: dg.DagsterInstance) -> list[str]:
    """One line per active run this process cannot judge: started on another host or PID namespace."""
    here = pid_namespace()
    return [
        f"run {run.run_id} ({run.job_name}) runs in {run.tags.get(RUN_HOST_TAG, 'an unrecorded place')}, "
        f"not here ({here}): judge it where it runs"
        for run in instance.get_runs(dg.RunsFilter(statuses=ACTIVE_STATUSES))
        if run.tags.get(RUN_HOST_TAG) != here
    ]


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


def worker_processes(instance: dg.DagsterInstance, run_id: str) -> dict[int, float]:
    """Pid -> when it was first named, for the processes that executed the run's steps (engine events)."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
    processes: dict[int, float] = {}
    for record in records:
        entry = record.event_log_entry
        metadata = getattr(entry.dagster_event.event_specific_data, "metadata", None) or {}
        if "pid" in metadata:
            pid = int(metadata["pid"].value)
            processes[pid] = min(processes.get(pid, entry.timestamp), entry.timestamp)
    return processes


def alive_since(pid: int, named_at: float) -> bool:
    """Whether the process that had `pid` at time `named_at` still runs (not a later one given its pid)."""
    started = process_start_time(pid)
    return started is not None and started <= named_at + START_SLACK_S


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch); None when none runs (or only its zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc: whether the pid exists is all that can be told
        return _started_if_it_exists(pid)
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    if fields[0] == "Z":  # a zombie has exited
        return None
    ticks_after_boot = int(fields[19])  # field 22 of proc(5), the first after the name being field 3
    return _boot_time() + ticks_after_boot / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("/proc/stat has no btime line")


def _started_if_it_exists(pid: int) -> float | None:
    """Without /proc: 0.0 (started at an unknown time, so never taken for a reused pid) if `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return 0.0  # someone else's process: alive
    return 0.0
