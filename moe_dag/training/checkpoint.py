"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout of `<out>/checkpoints/step_<N>/`:

| file             | content                                                         | written by |
| ---------------- | --------------------------------------------------------------- | ---------- |
| model.pt         | model state dict (parameters and expert biases)                 | rank 0     |
| optimizer.pt     | optimizer (AdamW or Muon) and learning-rate scheduler state    | rank 0     |
| state.json       | step, tokens seen, data stream position                         | rank 0     |
| config.json      | the full Config of the run                                      | rank 0     |
| rng_rank<r>.pt   | torch CPU (and CUDA) generator state of rank r                  | each rank  |

A checkpoint is written under a hidden temporary name and renamed when complete, so a run killed while
saving never leaves a directory that looks finished; `latest_checkpoint` only sees finished ones.
Model and optimizer are replicated under data parallelism, so rank 0 writes them for everyone; sharded
torch.distributed.checkpoint replaces these two files when expert parallelism shards the experts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from moe_dag.training import distributed
from moe_dag.training.config import Config
from moe_dag.training.model import Transformer, build_model

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(kw_only=True, slots=True)
class TrainerState:
    step: int
    tokens_seen: int
    data: dict[str, Any]


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Finished checkpoints under `out_dir/checkpoints`, oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [path for _, path in sorted(found)]


def latest_checkpoint(out_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(out_dir)
    return checkpoints[-1] if checkpoints else None


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_checkpoint(
    out_dir: Path,
    *,
    config: Config,
    state: TrainerState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    keep: int,
) -> Path:
    """Write step `state.step` (every rank calls this), then keep only the newest `keep` checkpoints."""
    root = Path(out_dir) / "checkpoints"
    final, tmp = root / f"step_{state.step}", root / f".step_{state.step}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    torch.save(_rng_state(), tmp / f"rng_rank{rank}.pt")
    if rank == 0:
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt"
        )
        (tmp / "state.json").write_text(json.dumps(dataclasses.asdict(state), indent=2))
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    distributed.barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old)
    distributed.barrier()
    return final


def read_config(checkpoint: Path) -> Config:
    return Config.from_dict(json.loads((Path(checkpoint) / "config.json").read_text()))


def load_checkpoint(
    checkpoint: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
) -> TrainerState:
    """Restore model, optimizer, scheduler and this rank's RNG in place; return the trainer state."""
    checkpoint = Path(checkpoint)
    device = next(model.parameters()).device
    model.load_state_dict(torch.load(checkpoint / "model.pt", map_location=device, weights_only=True))
    saved = torch.load(checkpoint / "optimizer.pt", map_location=device, weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    rng_path = checkpoint / f"rng_rank{rank}.pt"
    if rng_path.exists():  # absent when resuming on more ranks than the run that saved
        rng = torch.load(rng_path, weights_only=True)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    raw = json.loads((checkpoint / "state.json").read_text())
    return TrainerState(step=raw["step"], tokens_seen=raw["tokens_seen"], data=raw["data"])


def load_model(checkpoint: Path, device: torch.device | str = "cpu") -> tuple[Transformer, Config]:
    """The model of a checkpoint, in eval mode, with the config it was trained with."""
    checkpoint = Path(checkpoint)
    if not (checkpoint / "model.pt").exists():
        raise ValueError(f"{checkpoint}: no model.pt; expected a directory like <out>/checkpoints/step_<N>")
    config = read_config(checkpoint)
    model = build_model(config.model, device)
    model.load_state_dict(torch.load(checkpoint / "model.pt", map_location=device, weights_only=True))
    return model.eval(), config
