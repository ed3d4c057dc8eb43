"""Experiment tracking with Weights & Biases, off unless asked for, never needing the network by default.

Mode: `train.wandb_mode` when set, else $WANDB_MODE, else "disabled". "offline" writes the run under
`<out>/wandb` (upload later with `wandb sync`); "online" needs network and credentials. The run id is
kept in `<out>/wandb_run_id` so a resumed training continues the same wandb run. Only rank 0 tracks.

A launcher may say which run of its graph this training is (`--graph-context FILE`: for the `moe_proxy`
asset, the Dagster run id, the asset and its partition, its code version, the data versions of its inputs
and the pipeline config's digest). The tracking run then carries it as config (under `graph`) and as
tags, and holds the run folder's path (`run_dir`); the run folder holds `tracking.json`, which names the
tracking run (backend, id, path, url or offline files) beside the graph context, so either side finds
the other. The Dagster asset shows `tracking.json` in its materialization.
"""

from __future__ import annotations

import json
import os
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
    """Logs metric dicts to a tracking run, or does nothing when tracking is disabled."""

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
    mode = resolve_mode(config.train.wandb_mode)
    if not is_main or mode == "disabled":
        return Tracker()
    import wandb  # imported only when used: it is slow to import and starts a service process

    out_dir, graph = Path(out_dir), graph or {}
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
        "graph": graph,
    }
    (out_dir / TRACKING_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return Tracker(run)
