"""Issue 35, item 5: a run killed after it claims its pool slot but before it records where its
processes live (the pipeline resource tags it) must not hold the slot for ever.

A real process on a real instance folder, as in test_pool_slots: a pooled asset without the pipeline
resource claims the slot and is never tagged, as a run killed between the claim and the tag."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest

from moe_dag.assets.run_identity import RUN_HOST_TAG
from moe_dag.orchestration import instance_health
from moe_dag.orchestration.instance_health import free_dead_runs, pool_holders
from tests.faults.test_pool_slots import home  # noqa: F401 - `home` is a fixture

pytestmark = pytest.mark.slow  # a real process, killed

UNTAGGED_RUN = textwrap.dedent(
    """
    import sys, time
    import dagster as dg

    @dg.asset(pool="gpu")
    def pooled():
        open(sys.argv[1], "w").close()
        time.sleep(600)

    dg.materialize([pooled], instance=dg.DagsterInstance.get())
    """
)


def start_untagged_run(tmp_path: Path) -> subprocess.Popen:
    marker, script = tmp_path / "holding", tmp_path / "untagged.py"
    script.write_text(UNTAGGED_RUN)
    process = subprocess.Popen([sys.executable, str(script), str(marker)])
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the pooled run never started"
        time.sleep(0.2)
    return process


def test_a_slot_claimed_by_a_run_that_never_recorded_its_place_is_freed_after_the_grace(
    home,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    process = start_untagged_run(tmp_path)
    instance = dg.DagsterInstance.get()
    [holder] = pool_holders(instance, {"gpu"})
    assert RUN_HOST_TAG not in instance.get_run_by_id(holder.run_id).tags
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    # Within the grace a run may still be setting up its resources: left alone.
    assert free_dead_runs(instance) == []
    assert pool_holders(instance, {"gpu"}) == [holder]

    monkeypatch.setattr(instance_health, "UNTAGGED_GRACE_S", 0.0)
    [line] = free_dead_runs(instance)
    assert line.startswith(f"run {holder.run_id} (__ephemeral_asset_job__): holds pool 'gpu' ")
    assert "never recorded where its processes run" in line and "its pool slots are free" in line
    assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.FAILURE
    assert pool_holders(instance, {"gpu"}) == []
