"""The new-shards sensors under a real `dagster-daemon`, not the simulated daemon of tests/test_new_data.py.

A temporary Dagster instance (the repository's dagster.yaml with the run queue closed, SQLite in the
temporary home), a code server (`dagster api grpc`) loading the project's definitions for a two-source
test config, and the daemon reading a workspace that points at it (a `python_module` entry would have
the daemon and each `dagster sensor start` load the graph again, 30 s each on two busy cores). Both
sources have one shard already in the shard ledger; a second shard is dropped into source `a`;
`dagster sensor start` turns on both sources' sensors (they are stopped by default). The daemon
evaluates a sensor at once when it has no tick yet (after that, every `minimum_interval_seconds`, 60),
so within seconds of starting: `a`'s tick requests one `raw_documents` run of partition `a` for exactly
the new shard, and `b`'s tick skips. The run stays queued (`max_concurrent_runs: 0`): what ingesting
does is tested elsewhere. Afterwards the daemon's and the code server's process groups are stopped, and
no process of this instance is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from moe_dag.assets.dagster_internals import PARTITION_TAG
from moe_dag.config import load_config
from moe_dag.engine.shard_ledger import ShardLedger, ShardRead, file_checksum, ledger_path, scan_shards
from moe_dag.orchestration.automation import TAG_NEW_SHARDS, TAG_SOURCE, shards_tag
from tests.local_processes import free_port, processes_with_environment, start_group, stop_group
from tests.test_dedup_backfill import SOURCES, pipeline_config, sentence_text, write_shard

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # dagster and dagster-daemon of this environment
SENSOR_TAG = "dagster/sensor_name"  # Dagster's tag on a run that a sensor requested
# The code server imports the whole graph: 30 s at load 26 on two cores, more when busier.
STARTUP_SECONDS = 240
TICK_SECONDS = 90  # from the sensors started to both sensors' first ticks done


@pytest.mark.slow
def test_the_daemon_requests_the_sources_partition_when_a_new_shard_arrives(tmp_path: Path) -> None:
    config_path, new_shard = sources_with_a_new_shard_in_a(tmp_path)
    home = tmp_path / "dagster_home"
    home.mkdir()
    instance_config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    instance_config["concurrency"]["runs"]["max_concurrent_runs"] = 0  # requested runs stay queued
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config))
    port = free_port()
    workspace = tmp_path / "workspace.yaml"
    location = {"host": "127.0.0.1", "port": port, "location_name": "moe_dag"}
    workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": location}]}))
    env = os.environ | {"DAGSTER_HOME": str(home), "MOE_DAG_CONFIG": str(config_path)}

    # The SQLite storage is created here, in one process: two processes creating it at once can both
    # stamp its schema version (tests/test_ui_browser.py).
    instance = dg.DagsterInstance.from_config(str(home))
    instance.get_runs(limit=1)
    instance.all_instigator_state()

    code_log, daemon_log = tmp_path / "code_server.log", tmp_path / "daemon.log"
    module = ["-m", "moe_dag.orchestration.definitions", "-h", "127.0.0.1", "-p", str(port)]
    server = start_group([str(BIN / "dagster"), "api", "grpc", *module], code_log, env, cwd=REPO)
    daemon = None
    try:
        daemon = start_group([str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], daemon_log, env)
        wait_for_log(code_log, "Started Dagster code server", server)
        for source in SOURCES:
            start = [str(BIN / "dagster"), "sensor", "start", f"new_shards_{source}", "-w", str(workspace)]
            started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=STARTUP_SECONDS)
            assert started.returncode == 0, f"{' '.join(start[1:])}:\n{started.stdout}{started.stderr}"
        ticks = wait_for_first_ticks(instance, [f"new_shards_{source}" for source in SOURCES], daemon_log)

        (run,) = instance.get_runs(dg.RunsFilter(tags={SENSOR_TAG: "new_shards_a"}))
        assert run.tags[PARTITION_TAG] == "a" and run.tags[TAG_SOURCE] == "a"
        assert run.tags[TAG_NEW_SHARDS] == shards_tag([new_shard])  # the new shard alone
        assert run.asset_selection == {dg.AssetKey("raw_documents")}
        assert run.status == dg.DagsterRunStatus.QUEUED
        assert ticks["new_shards_a"].status.value == "SUCCESS" and ticks["new_shards_a"].run_ids == [
            run.run_id
        ]
        assert ticks["new_shards_b"].status.value == "SKIPPED"
        assert "no new shards" in ticks["new_shards_b"].skip_reason
        assert not instance.get_runs(dg.RunsFilter(tags={SENSOR_TAG: "new_shards_b"}))
    finally:
        for process in (daemon, server):
            if process is not None:
                stop_group(process)
        instance.dispose()
    assert not processes_with_environment("DAGSTER_HOME", str(home))


def sources_with_a_new_shard_in_a(folder: Path) -> tuple[Path, str]:
    """Sources `a` and `b` with one shard each, entered in the shard ledger as a run of `raw_documents`
    enters them; then a new shard in `a`. Returns the config's path and the new shard's."""
    corpus = folder / "corpus"
    for number, source in enumerate(SOURCES):
        write_shard(corpus / source, f"{source}0", {f"{source}-0": sentence_text(number)})
    config_path = pipeline_config(folder, corpus, "pipeline")
    config = load_config(config_path)
    ledger = ShardLedger(ledger_path(config.catalog_path))
    for source in config.sources:
        read = [ShardRead(f.path, f.size, f.mtime, file_checksum(f.path)) for f in scan_shards(source.shards)]
        ledger.record(source.name, read, run_id="an-earlier-run")
    write_shard(corpus / "a", "a1", {"a-1": sentence_text(len(SOURCES))})
    known = {row["path"] for row in ledger.rows("a")}
    (new_shard,) = [f.path for f in scan_shards(str(corpus / "a")) if f.path not in known]
    return config_path, new_shard


def wait_for_log(log: Path, line: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while line not in log.read_text():
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {line!r} after {STARTUP_SECONDS} s:\n{log.read_text()}"
        time.sleep(0.5)


def wait_for_first_ticks(instance: dg.DagsterInstance, sensors: list[str], daemon_log: Path) -> dict:
    """The first finished tick of each sensor in `sensors`, all of them started (instigator state)."""
    deadline = time.monotonic() + TICK_SECONDS
    while True:
        states = {state.instigator_name: state for state in instance.all_instigator_state()}
        started = [states[name] for name in sensors if name in states]
        assert all(state.instigator_type.value == "SENSOR" for state in started)
        ticks = {
            state.instigator_name: tick
            for state in started
            if state.status.value == "RUNNING"
            for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
            if tick.status.value != "STARTED"
        }
        if len(ticks) == len(sensors):
            return ticks
        assert time.monotonic() < deadline, f"ticks after {TICK_SECONDS} s: {ticks}\n{daemon_log.read_text()}"
        time.sleep(1)
