"""Issue 23, items 4 and 10: a run is judged by its processes' pid *and* start time, only from the host
and PID namespace it runs in; a materialisation that must wait for a pool says who holds it.

Real processes on a real instance folder, as in test_pool_slots."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest

from moe_dag.assets.run_identity import RUN_HOST_TAG, pid_namespace
from moe_dag.orchestration import instance_health
from moe_dag.orchestration.instance_health import free_dead_runs, pool_holders
from tests.faults.test_pool_slots import home, start_run  # noqa: F401 - `home` is a fixture

pytestmark = pytest.mark.slow  # real processes, killed

FREE_STUCK_RUNS = "from moe_dag.cli.main import main; raise SystemExit(main(['free-stuck-runs']))"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_a_live_run_is_not_judged_from_another_pid_namespace(home, tmp_path):  # noqa: F811
    process, _ = start_run(tmp_path, seconds=600)
    try:
        instance = dg.DagsterInstance.get()
        [holder] = pool_holders(instance, {"gpu"})
        assert instance.get_run_by_id(holder.run_id).tags[RUN_HOST_TAG] == pid_namespace()
        elsewhere = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", FREE_STUCK_RUNS],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if elsewhere.returncode != 0 and "unshare" in elsewhere.stderr:
            pytest.skip(f"cannot make a PID namespace here: {elsewhere.stderr.strip()}")
        assert elsewhere.returncode == 0, elsewhere.stderr
        assert f"run {holder.run_id}" in elsewhere.stdout and "judge it where it runs" in elsewhere.stdout
        assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.STARTED
        assert pool_holders(instance, {"gpu"}) == [holder]
    finally:
        process.kill()
        process.wait()


def test_a_run_tagged_with_another_host_is_left_alone(home, tmp_path):  # noqa: F811
    process, _ = start_run(tmp_path, seconds=600)
    instance = dg.DagsterInstance.get()
    [holder] = pool_holders(instance, {"gpu"})
    process.kill()
    process.wait()
    instance.add_run_tags(holder.run_id, {RUN_HOST_TAG: "another-host boot 1 pid:[1]"})
    assert free_dead_runs(instance) == []
    assert pool_holders(instance, {"gpu"}) == [holder]


def test_a_reused_pid_does_not_keep_a_dead_run_alive(home, tmp_path, monkeypatch):  # noqa: F811
    process, _ = start_run(tmp_path, seconds=600)
    instance = dg.DagsterInstance.get()
    [holder] = pool_holders(instance, {"gpu"})
    named_at = min(instance_health.worker_processes(instance, holder.run_id).values())
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(instance_health.START_SLACK_S + 0.5)
    # A process started after the run named its pids, given (as the kernel may) a pid the run recorded.
    newcomer = subprocess.Popen(["sleep", "60"])
    try:
        monkeypatch.setattr(
            instance_health, "worker_processes", lambda instance, run_id: {newcomer.pid: named_at}
        )
        freed = free_dead_runs(instance)
    finally:
        newcomer.kill()
        newcomer.wait()
    assert any(holder.run_id in line and "marked failed" in line for line in freed)
    assert pool_holders(instance, {"gpu"}) == []


def test_dagster_asset_materialize_says_who_holds_a_pool_and_frees_it_once_dead(home, tmp_path):  # noqa: F811
    instance = dg.DagsterInstance.get()
    argv = ["/venv/bin/dagster", "asset", "materialize", "-m", "moe_dag.orchestration.definitions"]
    process, _ = start_run(tmp_path, seconds=600)
    [holder] = pool_holders(instance, {"gpu"})
    lines: list[str] = []
    try:
        instance_health.unstick_daemonless_command(instance, ["/venv/bin/dagster", "dev"], lines.append)
        assert lines == []  # there the daemon's sensor does it
        instance_health.unstick_daemonless_command(instance, argv, lines.append)
    finally:
        process.kill()
        process.wait()
    [waiting] = lines
    assert f"pool 'gpu' is held by run {holder.run_id}" in waiting and "moe-dag free-stuck-runs" in waiting
    instance_health.unstick_daemonless_command(instance, argv, lines.append)
    assert lines[1].startswith(f"moe-dag freed: run {holder.run_id}") and len(lines) == 2
    assert pool_holders(instance, {"gpu"}) == []
