"""Where a run's processes live: the host and PID namespace each run records as a tag.

A pid means something only on its host and within its PID namespace, so a run tags itself with both
(`RUN_HOST_TAG`) when its resources are set up; the stuck-run reaper (orchestration/instance_health.py)
judges a run only from that same place.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import dagster as dg

RUN_HOST_TAG = "moe_dag/pid_namespace"
SEVERAL_HOSTS = "several"


def record_run_host(instance: dg.DagsterInstance, run_id: str) -> None:
    """Tag the run with this process's host and PID namespace, where its pids mean something."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return
    here, recorded = pid_namespace(), run.tags.get(RUN_HOST_TAG)
    if recorded != here:
        instance.add_run_tags(run_id, {RUN_HOST_TAG: here if recorded is None else SEVERAL_HOSTS})


def pid_namespace() -> str:
    """This host, its boot and this process's PID namespace: a pid names the same process only within."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc (not Linux): the host name is all there is
        return socket.gethostname()
    return f"{socket.gethostname()} boot {boot} {namespace}"
