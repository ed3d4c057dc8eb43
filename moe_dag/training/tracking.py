"""Experiment tracking with Weights & Biases, off unless asked for, never needing the network by default.

Mode: `train.wandb_mode` when set, else $WANDB_MODE, else "disabled". "offline" writes the run under
`<out>/wandb` (upload later with `wandb sync`); "online" needs network and credentials. The run id is
kept in `<out>/wandb_run_id` so a resumed training continues the same wandb run. Only rank 0 tracks.
"""

from __future__ import annotations

import os
import typing
import uuid
from pathlib import Path
from typing import Any

from moe_dag.training.config import Config, WandbMode


def resolve_mode(configured: WandbMode | None) -> WandbMode:
    mode = configured or os.environ.get("WANDB_MODE") or "disabled"
    allowed = typing.get_args(WandbMode)
    if mode not in allowed:
        raise ValueError(f"WANDB_MODE={mode!r} is not one of {allowed}")
    return typing.cast(WandbMode, mode)


class Tracker:
    """Logs metric dicts to a wandb run, or does nothing when tracking is disabled."""

    def __init__(self, run: Any = None) -> None:
        self.run = run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


def start_tracking(config: Config, out_dir: Path, *, is_main: bool) -> Tracker:
    mode = resolve_mode(config.train.wandb_mode)
    if not is_main or mode == "disabled":
        return Tracker()
    import wandb  # imported only when used: it is slow to import and starts a service process

    id_file = Path(out_dir) / "wandb_run_id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:8])  # wandb run ids: 8 characters [a-z0-9]
    run = wandb.init(
        project=config.train.wandb_project,
        dir=out_dir,
        mode=mode,
        id=id_file.read_text().strip(),
        resume="allow",
        config=config.to_dict(),
    )
    return Tracker(run)
