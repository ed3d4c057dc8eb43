"""Tracking over HTTP: a real MLflow tracking server (its own environment, `make setup` builds
.venv-mlflow) on a free local port, and two Dagster runs of a training asset that launches the trainer
as `moe_proxy` does (`launch_training`: the graph context file, Dagster Pipes, `train.tracking=mlflow`).
MLflow's client then reads back what the run holds: the Dagster run id, the asset's code version and
its input's data version, the config digest, the trainer's config as params, the loss per step. The
whole graph's `moe_proxy` is tested the same way with wandb offline in tests/test_tracked_pretrained_run.py.
"""

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from moe_dag.assets.training_runs import launch_training
from moe_dag.config import TrainingLaunchConfig
from moe_dag.training.config import apply_overrides, tiny
from moe_dag.training.tracking import TRACKING_FILE, start_tracking
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
        stop_group(server, timeout=10)  # its graceful stop took 26 s on a busy machine


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


MIXTURE_VERSION = "mixture-data-7"
CONFIG_DIGEST = "config-digest-3"


def training_assets(data_dir: Path, out_dir: Path, uri: str, steps: int) -> list[dg.AssetsDefinition]:
    """An input standing for `tokenized_mixture` (the mixture in `data_dir`, at a known data version) and
    a training asset that launches the trainer on it in `out_dir` as `moe_proxy` does."""

    @dg.asset(name="tokenized_mixture", code_version="mixture-code-1")
    def mixture() -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=dg.DataVersion(MIXTURE_VERSION))

    @dg.asset(name="moe_proxy", deps=[mixture], code_version=f"proxy-code-{steps}")
    def proxy(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        overrides = {"train.tracking": "mlflow", "train.tracking_uri": uri, "train.num_threads": 1}
        launch = TrainingLaunchConfig(preset="tiny", steps=steps, overrides=overrides)
        out_dir.mkdir(exist_ok=True)
        metadata = launch_training(context, launch, data_dir, out_dir, config_digest=CONFIG_DIGEST)
        return dg.MaterializeResult(metadata=metadata)

    return [mixture, proxy]


@pytest.mark.slow
def test_the_mlflow_run_holds_the_dagster_run_and_the_data_versions(
    mlflow_server: str,
    repeating_data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    instance, out = dg.DagsterInstance.ephemeral(), tmp_path / "run"
    # A first Dagster run trains 3 steps; a second one continues the same folder to 4: the same MLflow run.
    first = dg.materialize(training_assets(repeating_data, out, mlflow_server, 3), instance=instance)
    second = dg.materialize(
        training_assets(repeating_data, out, mlflow_server, 4), selection=["moe_proxy"], instance=instance
    )
    assert first.success and second.success
    (materialization,) = second.asset_materializations_for_node("moe_proxy")
    record = materialization.metadata["tracking"].value
    latest = {
        "dagster_run_id": second.run_id,
        "asset": "moe_proxy",
        "partition": None,
        "code_version": "proxy-code-4",
        "input_data_versions": {"tokenized_mixture": MIXTURE_VERSION},
        "config_digest": CONFIG_DIGEST,
    }
    assert record == json.loads((out / TRACKING_FILE).read_text())
    assert record["backend"] == "mlflow" and record["tracking_uri"] == mlflow_server
    assert record["graph"] == latest and record["run_id"] == (out / "mlflow_run_id").read_text()

    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.experiment_id == record["experiment_id"]
    tags = run.data.tags
    assert {key: tags[key] for key in ("dagster_run_id", "asset", "code_version", "config_digest")} == {
        "dagster_run_id": second.run_id,  # the latest Dagster run that trained it
        "asset": "moe_proxy",
        "code_version": "proxy-code-4",
        "config_digest": CONFIG_DIGEST,
    }
    assert "partition" not in tags  # unpartitioned: no tag, as wandb has none
    assert tags["data_version/tokenized_mixture"] == MIXTURE_VERSION
    assert json.loads(tags["graph"]) == latest and tags["run_dir"] == str(out)
    params = run.data.params
    assert params["train.steps"] == "3"  # a param never changes: those of the run's first start
    assert params["train.tracking"] == "mlflow" and params["model.d_model"] == str(tiny().model.d_model)
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
