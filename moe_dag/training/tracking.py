"""Experiment tracking, off unless asked for, never needing the network by default: Weights & Biases, or
an MLflow tracking server (`train.tracking`). Only rank 0 tracks.

wandb's mode: `train.wandb_mode` when set, else $WANDB_MODE, else "disabled". "offline" writes the run
under `<out>/wandb` (upload later with `wandb sync`); "online" needs network and credentials. The run id
is kept in `<out>/wandb_run_id` so a resumed training continues the same wandb run.

MLflow (`train.tracking=mlflow`, the `mlflow` extra): the server at `train.tracking_uri`, else
$MLFLOW_TRACKING_URI; the experiment is `train.wandb_project`. The trainer's config is logged as params
(dotted keys) when the run is created: MLflow never changes a param, so a resumed run keeps those of its
first start. The run id is kept in `<out>/mlflow_run_id` as wandb's is.

A launcher may say which run of its graph this training is (`--graph-context FILE`: for the `moe_proxy`
asset, the Dagster run id, the asset and its partition, its code version, the data versions of its inputs
and the pipeline config's digest). The tracking run then carries it as config (under `graph`; MLflow:
the tag `graph`, JSON) and as tags (wandb: `key:value`; MLflow: one tag per key, and `data_version/<asset>`
per input), and holds the run folder's path (`run_dir`); the run folder holds `tracking.json`, which
names the tracking run (backend, id, path, url or offline files) beside the graph context, so either side
finds the other. The Dagster asset shows `tracking.json` in its materialization.
"""

from __future__ import annotations

import json
import os
import time
import typing
import uuid
from pathlib import Path
from typing import Any

from moe_dag.training.config import Config, WandbMode

GRAPH_CONTEXT_FILE = "graph_context.json"  # what the launcher says about this run, in the run folder
TRACKING_FILE = "tracking.json"  # where this run's tracking record is
MAX_TAG_LENGTH = 64  # wandb refuses longer tags
# Graph context entries shown as tags (searchable in the tracking UI); the rest is in the config only.
TAGGED = ("dagster_run_id", "asset", "partition", "code_version", "config_digest")


def resolve_mode(configured: WandbMode | None) -> WandbMode:
    mode = configured or os.environ.get("WANDB_MODE") or "disabled"
    allowed = typing.get_args(WandbMode)
    if mode not in allowed:
        raise ValueError(f"WANDB_MODE={mode!r} is not one of {allowed}")
    return typing.cast(WandbMode, mode)


def read_graph_context(path: Path | None) -> dict[str, Any]:
    """The launcher's description of this run (`GRAPH_CONTEXT_FILE`), or nothing without one."""
    return json.loads(Path(path).read_text()) if path is not None else {}


def graph_tags(graph: dict[str, Any]) -> list[str]:
    """`key:value` tags for the graph context's identifying entries that are set."""
    return [f"{key}:{graph[key]}"[:MAX_TAG_LENGTH] for key in TAGGED if graph.get(key) is not None]


class Tracker:
    """Logs metric dicts to a tracking run, or does nothing when tracking is disabled. `run`: anything
    with wandb's `log(metrics, step=)` and `finish()` (a wandb run, or `MlflowRun`)."""

    def __init__(self, run: Any = None) -> None:
        self.run = run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


def start_tracking(
    config: Config, out_dir: Path, *, is_main: bool, graph: dict[str, Any] | None = None
) -> Tracker:
    """The tracking run of this training (resumed in `out_dir` when it has one), labelled with `graph`
    (`read_graph_context`), and its record written to `out_dir/tracking.json`."""
    if not is_main:
        return Tracker()
    out_dir, graph = Path(out_dir), graph or {}
    if config.train.tracking == "mlflow":
        run, record = _start_mlflow(config, out_dir, graph)
    else:
        mode = resolve_mode(config.train.wandb_mode)
        if mode == "disabled":
            return Tracker()
        run, record = _start_wandb(config, out_dir, graph, mode)
    (out_dir / TRACKING_FILE).write_text(json.dumps(record | {"graph": graph}, indent=2) + "\n")
    return Tracker(run)


def _start_wandb(
    config: Config, out_dir: Path, graph: dict[str, Any], mode: WandbMode
) -> tuple[Any, dict[str, Any]]:
    import wandb  # imported only when used: it is slow to import and starts a service process

    id_file = out_dir / "wandb_run_id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:8])  # wandb run ids: 8 characters [a-z0-9]
    run = wandb.init(
        project=config.train.wandb_project,
        dir=out_dir,
        mode=mode,
        id=id_file.read_text().strip(),
        resume="allow",
    )
    # Set after init rather than through it: a resumed run takes the new graph context (another Dagster
    # run continued it) instead of refusing the changed values, and keeps the tags of earlier runs.
    run.config.update({**config.to_dict(), "graph": graph, "run_dir": str(out_dir)}, allow_val_change=True)
    run.tags = tuple(dict.fromkeys([*run.tags, *graph_tags(graph)]))
    record = {
        "backend": "wandb",
        "mode": mode,
        "run_id": run.id,
        "run_path": run.path,
        "url": run.url,  # None offline
        "files": str(Path(run.dir).parent),  # offline: `wandb sync` this folder
    }
    return run, record


class MlflowRun:
    """One MLflow run behind wandb's `log`/`finish`: metrics in batches, the run ended as finished."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        logged = [
            Metric(key, float(value), now, step)
            for key, value in metrics.items()
            if isinstance(value, int | float)  # MFU is None where no peak is known
        ]
        self.client.log_batch(self.run_id, metrics=logged)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


def _start_mlflow(config: Config, out_dir: Path, graph: dict[str, Any]) -> tuple[MlflowRun, dict[str, Any]]:
    try:
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError as error:
        raise ImportError(
            "train.tracking=mlflow needs the MLflow client: pip install 'moe-dag[mlflow]' (make setup has it)"
        ) from error
    uri = config.train.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError(
            "train.tracking=mlflow needs train.tracking_uri or $MLFLOW_TRACKING_URI (the server)"
        )
    client = MlflowClient(tracking_uri=uri)
    name = config.train.wandb_project
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)

    id_file = out_dir / "mlflow_run_id"
    run_id = id_file.read_text().strip() if id_file.exists() else None
    if run_id is not None:
        try:
            client.update_run(run_id, status="RUNNING")
        except MlflowException:  # not on this server (another tracking_uri, or its store was wiped)
            run_id = None
    params: list[Param] = []
    if run_id is None:
        run_id = client.create_run(experiment_id).info.run_id
        id_file.write_text(run_id)
        params = [Param(key, str(value)) for key, value in _dotted(config.to_dict()).items()]
    tags = {key: str(graph[key]) for key in TAGGED if graph.get(key) is not None}
    tags |= {f"data_version/{asset}": str(v) for asset, v in graph.get("input_data_versions", {}).items()}
    tags |= {"graph": json.dumps(graph, sort_keys=True), "run_dir": str(out_dir)}
    run_tags = [RunTag(key, value) for key, value in tags.items()]
    batch = 100  # MLflow's limit on params and tags in one request
    for start in range(0, max(len(params), len(run_tags)), batch):
        client.log_batch(run_id, params=params[start : start + batch], tags=run_tags[start : start + batch])
    base = uri.rstrip("/")
    record = {
        "backend": "mlflow",
        "tracking_uri": uri,
        "experiment_id": experiment_id,
        "run_id": run_id,
        "url": f"{base}/#/experiments/{experiment_id}/runs/{run_id}" if base.startswith("http") else None,
    }
    return MlflowRun(client, run_id), record


def _dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` as `{"a.b": 1}`: the trainer's config as MLflow params, named as `--set` does."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _dotted(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
