"""Issue 6, item 1: a run killed with SIGKILL while it holds a pool slot must not block every later run.

The runs here are real processes on a real instance folder: a pooled asset claims the `gpu` slot, the
process is killed, and the next pooled stage must get the slot back (and say who held it while it waits).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest

from moe_dag.orchestration.instance_health import free_dead_runs, pool_holders
from moe_dag.orchestration.pipeline import _report_pool_waits

pytestmark = pytest.mark.slow  # real processes, killed

INSTANCE_YAML = """
telemetry: {enabled: false}
concurrency:
  pools: {granularity: op, default_limit: 1}
"""

# A pooled asset that announces it holds the slot, then works for `seconds`. Like every stage it takes
# the pipeline resource, which records where the run's processes live.
RUN_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import dagster as dg
    from moe_dag.assets.resources import PipelineResource

    marker, seconds = sys.argv[1], float(sys.argv[2])

    @dg.asset(pool="gpu")
    def pooled(pipeline: PipelineResource):
        open(marker, "w").close()
        time.sleep(seconds)

    dg.materialize(
        [pooled],
        instance=dg.DagsterInstance.get(),
        resources={"pipeline": PipelineResource(config_path="unread.yaml")},
    )
    """
)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def start_run(tmp_path: Path, seconds: float) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / f"holding-{time.monotonic_ns()}"
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(marker), str(seconds)])
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None, "the pooled run exited before claiming its slot"
        assert time.monotonic() < deadline, "the pooled run never started"
        time.sleep(0.2)
    return process, marker


def test_a_killed_run_gives_its_slot_back(home, tmp_path):
    process, _ = start_run(tmp_path, seconds=600)
    instance = dg.DagsterInstance.get()
    [holder] = pool_holders(instance, {"gpu"})
    assert holder.run_status == "STARTED" and holder.step_key == "pooled"
    assert free_dead_runs(instance) == []  # alive: left alone

    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    freed = free_dead_runs(instance)
    assert any(holder.run_id in line and "marked failed" in line for line in freed)
    assert instance.get_run_by_id(holder.run_id).status == dg.DagsterRunStatus.FAILURE
    assert pool_holders(instance, {"gpu"}) == []

    # The next pooled run gets the slot at once.
    follower, _ = start_run(tmp_path, seconds=0)
    assert follower.wait(timeout=120) == 0


def test_a_stage_that_must_wait_says_which_run_holds_the_pool(home, tmp_path):
    process, _ = start_run(tmp_path, seconds=600)
    instance = dg.DagsterInstance.get()
    lines: list[str] = []
    try:
        _report_pool_waits(instance, {"gpu"}, lines.append)
    finally:
        process.kill()
        process.wait()
    [holder] = pool_holders(instance, {"gpu"})
    assert lines == [
        f"waiting: pool 'gpu' is held by run {holder.run_id} (step pooled, STARTED); "
        "the stage starts when it ends (or: moe-dag free-stuck-runs)"
    ]
    _report_pool_waits(instance, {"gpu"}, lines.append)
    assert len(lines) == 2 and lines[-1].startswith(f"freed: run {holder.run_id}")


def test_a_run_marked_failed_by_hand_frees_its_slot_too(home, tmp_path):
    process, _ = start_run(tmp_path, seconds=600)
    instance = dg.DagsterInstance.get()
    [holder] = pool_holders(instance, {"gpu"})
    process.kill()
    process.wait()
    instance.report_run_failed(instance.get_run_by_id(holder.run_id), "marked failed by hand")
    assert pool_holders(instance, {"gpu"})  # Dagster alone leaves the slot claimed
    freed = free_dead_runs(instance)
    assert freed == [f"pool 'gpu': freed the slot of run {holder.run_id}, which has ended"]
    assert pool_holders(instance, {"gpu"}) == []
