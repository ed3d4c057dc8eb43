"""Issue 6, items 2 and 3: a trainer never outlives its launcher, one writer per run folder, and a torn
last line of metrics.jsonl does not block resume. Kill tests kill real processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_trainer import SEQ_LEN, fast_config, write_mixture

from moe_dag.training.run_lock import RunFolderInUse, run_lock
from moe_dag.training.run_outputs import MetricsLog
from moe_dag.training.trainer import train
from tests.pipeline_configs import Replace


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    return write_mixture(tmp_path / "data", rows)


# ------------------------------------------------------------------ item 3: a torn metrics.jsonl tail


def test_a_torn_last_line_is_ignored_when_read_and_cut_when_replaced(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    log = MetricsLog(path)
    assert [record["step"] for record in log.read()] == [1, 2]
    log.replace(log.read())
    assert path.read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'


def test_a_corrupt_line_before_the_last_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2"):
        MetricsLog(path).read()


def test_a_run_killed_mid_line_resumes_to_the_uninterrupted_metrics(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = fast_config(6, checkpoint_every=3)
    train(config, data, out)
    uninterrupted = MetricsLog(out / "metrics.jsonl").read()

    # As if killed while appending step 5's line, after the step 3 checkpoint.
    shutil.rmtree(out / "checkpoints" / "step_6")
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])
    train(config, data, out)

    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in uninterrupted]


# ------------------------------------------------- item 2: an orphaned trainer, a second writer


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _has_metrics(run_dir_glob: str, root: Path) -> bool:
    return any(path.stat().st_size > 0 for path in root.glob(run_dir_glob))


LAUNCH_MOE_PROXY = """
import sys
import dagster as dg
from moe_dag.assets.training import moe_proxy
from moe_dag.assets.resources import PipelineResource
dg.materialize([moe_proxy], resources={"pipeline": PipelineResource(config_path=sys.argv[1])})
"""


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_killing_the_dagster_process_kills_its_trainer(
    data: Path, tmp_path: Path, make_config, nproc: int
) -> None:
    """kill -9 of the process materialising moe_proxy takes the trainer (and torchrun's workers) with it;
    the rerun then resumes in the same run folder with every step logged once."""
    lake = tmp_path / "lake"
    shutil.copytree(data, lake / "tokenized_mixture")
    overrides = {"train.num_threads": 1, "train.checkpoint_every": 5}
    training = Replace(preset="tiny", steps=100_000, nproc_per_node=nproc, overrides=overrides)
    config_path = make_config({"training": training})
    env = {**os.environ, "WANDB_MODE": "disabled"}
    dagster = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_MOE_PROXY, str(config_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trainers: list[int] = []
    try:
        _wait_for(lambda: _has_metrics("moe_proxy/*/metrics.jsonl", lake), 180, "training to start")
        trainers = _descendants(dagster.pid)
        assert len(trainers) >= nproc
        dagster.kill()
        dagster.wait()
        _wait_for(lambda: not any(map(_alive, trainers)), 30, f"trainers {trainers} to die")
    finally:
        dagster.kill()
        _kill_all(trainers)

    run_dir = next(lake.glob("moe_proxy/*/metrics.jsonl")).parent
    finished = MetricsLog(run_dir / "metrics.jsonl").read()[-1]["step"]
    command = [sys.executable, "-m", "moe_dag.training", "--data", str(lake / "tokenized_mixture")]
    command += ["--out", str(run_dir), "--preset", "tiny", "--steps", str(finished + 3)]
    # One process with the killed run's global batch (tiny's 4 rows per rank) reads the same rows.
    command += ["--set", "train.num_threads=1", "--set", f"train.batch_size={4 * nproc}"]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
    steps = [record["step"] for record in MetricsLog(run_dir / "metrics.jsonl").read()]
    assert steps == list(range(1, finished + 4))


@pytest.mark.slow
def test_a_second_trainer_in_a_busy_run_folder_is_refused(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "moe_dag.training", "--data", str(data), "--out", str(out)]
    command += ["--preset", "tiny", "--set", "train.num_threads=1"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    first = subprocess.Popen(
        [*command, "--steps", "100000"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_for(lambda: _has_metrics("metrics.jsonl", out), 120, "the first trainer to start")
        second = subprocess.run(
            [*command, "--steps", "3"], env=env, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        first.kill()
        first.wait()
    assert second.returncode != 0
    assert f"{out} is in use by another trainer (pid {first.pid}" in second.stderr
    steps = [record["step"] for record in MetricsLog(out / "metrics.jsonl").read()]
    assert steps == list(range(1, len(steps) + 1))


CHILD = """
import time
from moe_dag.training.lifeline import die_with_launcher
die_with_launcher()
print("ready", flush=True)
time.sleep(120)
"""
PARENT = """
import os, subprocess, sys
from moe_dag.training.lifeline import launcher_env
env = {**os.environ, **(launcher_env() if sys.argv[1] == "tied" else {})}
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], env=env, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.parametrize("tied", [True, False])
def test_a_child_dies_with_its_launcher_only_when_the_launcher_asks(tied: bool) -> None:
    """With $MOE_DAG_LAUNCHER_PID the child gets SIGKILL when its parent is killed; without it (a run
    started by hand, under nohup say) the child outlives its parent as any process does."""
    mode = "tied" if tied else "free"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        if tied:
            _wait_for(lambda: not _alive(child), 10, "the child to die")
        else:
            time.sleep(1)
            assert _alive(child)
    finally:
        _kill_all([child])


def test_a_child_whose_launcher_is_already_gone_does_not_start() -> None:
    env = {**os.environ, "MOE_DAG_LAUNCHER_PID": "1"}  # not our parent: as if the launcher had died
    result = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "exited before training started" in result.stderr


def test_the_run_lock_refuses_a_second_holder_and_frees_itself(tmp_path: Path) -> None:
    with (
        run_lock(tmp_path),
        pytest.raises(RunFolderInUse, match=rf"{tmp_path} is in use by another trainer \(pid {os.getpid()}"),
        run_lock(tmp_path),
    ):
        pass
    with run_lock(tmp_path):  # released on leaving the block
        pass
