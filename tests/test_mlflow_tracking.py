"""Tracking over HTTP: a real MLflow tracking server (its own environment, `make setup` builds
.venv-mlflow) on a free local port, the trainer logging to it with `train.tracking=mlflow`, and MLflow's
client reading back what the run holds: the graph context a training asset hands the trainer (Dagster
run id, code and input data versions, config digest), the trainer's config as params, the loss per step.
The asset's side (what it writes into the graph context) is tested with wandb offline in
tests/test_tracked_pretrained_run.py; both backends take the same context."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from moe_dag.training.config import apply_overrides
from moe_dag.training.tracking import TRACKING_FILE, start_tracking
from moe_dag.training.trainer import train
from tests.local_processes import free_port, start_group, stop_group
from tests.test_trainer import fast_config, repeating_data  # noqa: F401 (a fixture)

SERVER = Path(__file__).resolve().parents[1] / ".venv-mlflow" / "bin" / "mlflow"
STARTUP_SECONDS = 180  # 25 s on two cores, 70 s at load 29: database migrations, then uvicorn


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not SERVER.exists():
        pytest.skip(f"no MLflow server at {SERVER}: make setup builds it")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [str(SERVER), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    log = folder / "server.log"
    server = start_group(command, log)  # the server, the uvicorn it starts and its job runner
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _healthy(uri):
            assert server.poll() is None, f"the MLflow server exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"no MLflow server after {STARTUP_SECONDS} s"
            time.sleep(0.5)
        yield uri
    finally:
        stop_group(server)


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def graph_context(dagster_run_id: str) -> dict[str, object]:
    """What the `moe_proxy` asset writes as graph_context.json (moe_dag/assets/training_runs.py)."""
    return {
        "dagster_run_id": dagster_run_id,
        "asset": "moe_proxy",
        "partition": None,
        "code_version": "moe_proxy-code-1",
        "input_data_versions": {"tokenized_mixture": "mixture-data-7"},
        "config_digest": "config-digest-3",
    }


@pytest.mark.slow
def test_the_mlflow_run_holds_the_dagster_run_and_the_data_versions(
    mlflow_server: str,
    repeating_data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    config = apply_overrides(fast_config(3), ["train.tracking=mlflow", f"train.tracking_uri={mlflow_server}"])
    out = tmp_path / "run"
    # A first Dagster run trains 3 steps; a second one continues the same folder to 4: the same MLflow run.
    for steps, dagster_run in ((3, "dagster-run-a"), (4, "dagster-run-b")):
        longer = dataclasses.replace(config.train, steps=steps)
        train(
            dataclasses.replace(config, train=longer), repeating_data, out, graph=graph_context(dagster_run)
        )

    record = json.loads((out / TRACKING_FILE).read_text())
    latest = graph_context("dagster-run-b")
    assert record["backend"] == "mlflow" and record["tracking_uri"] == mlflow_server
    assert record["graph"] == latest and record["run_id"] == (out / "mlflow_run_id").read_text()

    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.experiment_id == record["experiment_id"]
    assert client.get_experiment(run.info.experiment_id).name == config.train.wandb_project
    tags = run.data.tags
    assert {key: tags[key] for key in ("dagster_run_id", "asset", "code_version", "config_digest")} == {
        "dagster_run_id": "dagster-run-b",
        "asset": "moe_proxy",
        "code_version": "moe_proxy-code-1",
        "config_digest": "config-digest-3",
    }
    assert "partition" not in tags  # unpartitioned: no tag, as wandb has none
    assert tags["data_version/tokenized_mixture"] == "mixture-data-7"
    assert json.loads(tags["graph"]) == latest and tags["run_dir"] == str(out)
    params = run.data.params
    assert params["train.steps"] == "3"  # a param never changes: those of the run's first start
    assert params["train.tracking"] == "mlflow" and params["model.d_model"] == str(config.model.d_model)
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(metric.step for metric in losses) == [1, 2, 3, 4]
    assert all(metric.value > 0 for metric in losses)


def test_mlflow_tracking_names_what_it_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = apply_overrides(fast_config(1), ["train.tracking=mlflow"])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match="train.tracking_uri or \\$MLFLOW_TRACKING_URI"):
        start_tracking(config, tmp_path, is_main=True)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"moe-dag\[mlflow\]"):
        start_tracking(config, tmp_path, is_main=True)
    assert not (tmp_path / TRACKING_FILE).exists()
