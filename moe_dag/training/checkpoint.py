"""Checkpoints: everything needed to continue a run exactly where it stopped, at any EP size.

Layout of `<out>/checkpoints/step_<N>/`:

| file             | content                                                         | written by |
| ---------------- | --------------------------------------------------------------- | ---------- |
| state/           | torch.distributed.checkpoint of the model (parameters, expert   | every rank |
|                  | biases) and the optimizer (AdamW or Muon), keyed by parameter   |            |
|                  | name; each rank writes its shards, replicas are written once    |            |
| scheduler.pt     | learning-rate scheduler state                                   | rank 0     |
| state.json       | step, tokens seen, data stream position                         | rank 0     |
| config.json      | the full Config of the run                                      | rank 0     |
| rng_rank<r>.pt   | torch CPU (and CUDA) generator state of rank r                  | each rank  |
| metrics.jsonl    | the run's metrics up to this step, restored on resume           | rank 0     |
| manifest.json    | size and sha256 of every other file; written last, atomically   | rank 0     |

Resharding: under expert parallelism each rank holds E / P experts of every stacked expert weight.
In the checkpoint they are described with their global shape, [E, ...] split on dim 0 (a DTensor
placed Shard(0) over the "ep" mesh dimension and Replicate() over the "dp" one), the optimizer's
per-parameter state likewise; FSDP2 shards of the dense parts are DTensors already. Loading asks for
the slices the loading rank holds, so a run saved at EP=2 resumes at EP=1 and the reverse, and
`load_model` reads the whole model in one process. On several nodes `<out>` must be a shared
filesystem.

A checkpoint is written under a hidden temporary name and renamed when complete, so a run killed while
saving never leaves a directory that looks finished; `latest_checkpoint` only sees finished ones. A
save that fails (a full disk) removes the temporary folder and raises `CheckpointWriteError` naming the
checkpoint. torch's checkpoint metadata is a pickle, which runs code when loaded: every file is checked
against the manifest before anything is read, and a checkpoint that does not match is refused
(`CheckpointIntegrityError`). The manifest catches a file replaced or corrupted on its own; it does not
stop whoever can rewrite the manifest too, so run folders must be writable only by the trainer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, Replicate, Shard

from moe_dag.training import distributed
from moe_dag.training.config import Config
from moe_dag.training.expert_parallel import ExpertParallelDispatch
from moe_dag.training.model import Transformer, build_model
from moe_dag.training.run_outputs import METRICS_FILE, MetricsLog

_STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"


class CheckpointIntegrityError(ValueError):
    """A checkpoint whose files are not the ones its manifest lists: nothing of it was loaded."""


class CheckpointWriteError(OSError):
    """Saving a checkpoint failed; its temporary folder was removed."""


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
    try:
        _write_checkpoint(
            tmp,
            out_dir,
            config=config,
            state=state,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            rank=rank,
        )
    except (Exception, CheckpointException) as error:  # a full disk surfaces in torch without the path
        shutil.rmtree(tmp, ignore_errors=True)
        cause = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise CheckpointWriteError(
            f"saving checkpoint {final} failed, its temporary folder removed: {cause}"
        ) from error
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old)
    distributed.barrier()
    return final


def _write_checkpoint(
    tmp: Path,
    out_dir: Path,
    *,
    config: Config,
    state: TrainerState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
) -> None:
    if rank == 0:
        for unfinished in tmp.parent.glob(".step_*.tmp"):  # left by a save that was killed
            shutil.rmtree(unfinished, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    torch.save(_rng_state(), tmp / f"rng_rank{rank}.pt")
    with _quiet_single_process():
        dcp.save(_global_state(model, optimizer), checkpoint_id=tmp / "state", no_dist=_single_process())
    if rank == 0:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / "state.json").write_text(json.dumps(dataclasses.asdict(state), indent=2))
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        metrics = [r for r in MetricsLog(Path(out_dir) / METRICS_FILE).read() if r["step"] <= state.step]
        MetricsLog(tmp / METRICS_FILE).replace(metrics)
    distributed.barrier()
    if rank == 0:
        _write_manifest(tmp)


def _write_manifest(checkpoint: Path) -> None:
    """Size and sha256 of every file, written last and renamed into place: no manifest, no checkpoint."""
    files = {
        str(path.relative_to(checkpoint)): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file()
    }
    partial = checkpoint / f".{MANIFEST}.partial"
    with partial.open("w") as handle:
        json.dump({"files": files}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(checkpoint / MANIFEST)


def verify_checkpoint(checkpoint: Path) -> None:
    """Refuse `checkpoint` unless its files are exactly those of its manifest, byte for byte."""
    checkpoint = Path(checkpoint)
    manifest_path = checkpoint / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointIntegrityError(
            f"{checkpoint}: no {MANIFEST}, so its files cannot be checked before loading "
            "(a checkpoint of an older version, or one not written by the trainer)"
        )
    try:
        listed = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointIntegrityError(f"{manifest_path}: not a checkpoint manifest ({error})") from error
    present = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()} - {MANIFEST}
    problems = [f"{name} is not in its manifest" for name in sorted(present - set(listed))]
    problems += [f"{name} is missing" for name in sorted(set(listed) - present)]
    for name in sorted(present & set(listed)):
        path = checkpoint / name
        if path.stat().st_size != listed[name]["bytes"] or _sha256(path) != listed[name]["sha256"]:
            problems.append(f"{name} does not match its sha256 in the manifest")
    if problems:
        raise CheckpointIntegrityError(
            f"{checkpoint}: refused, nothing loaded: {'; '.join(problems)}. The checkpoint was changed "
            "after it was written; use an earlier checkpoint or retrain"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


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
    verify_checkpoint(checkpoint)
    state = _global_state(model, optimizer)
    with _quiet_single_process():  # loads in place, into this rank's slices
        dcp.load(state, checkpoint_id=checkpoint / "state", no_dist=_single_process())
    state = _local_state(state, model)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt", weights_only=True))
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
    if not (checkpoint / "state" / ".metadata").exists():
        raise ValueError(f"{checkpoint}: no state/; expected a directory like <out>/checkpoints/step_<N>")
    verify_checkpoint(checkpoint)
    config = read_config(checkpoint)
    model = build_model(config.model, device)
    state = {"model": model.state_dict()}
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=checkpoint / "state", no_dist=_single_process())
    model.load_state_dict(state["model"])
    return model.eval(), config


def _single_process() -> bool:
    return not torch.distributed.is_initialized()


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """torch.distributed.checkpoint warns on every single-process save and load, which is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        yield


def _expert_meshes(model: Transformer) -> dict[str, tuple[Any, int]]:
    """Name -> (("dp", "ep") mesh, local expert count) of every expert-parallel stacked weight."""
    found = {}
    for name, module in model.named_modules():
        dispatch = getattr(module, "dispatch", None)
        if isinstance(dispatch, ExpertParallelDispatch) and dispatch.mesh is not None:
            for weight_name, _ in module.experts.named_parameters():  # stacked: [local experts, ...]
                found[f"{name}.experts.{weight_name}"] = (dispatch.mesh, dispatch.local_experts)
    return found


def _as_global(tensor: torch.Tensor, mesh: Any) -> DTensor:
    """This rank's experts as a slice of the whole [E, ...] stack: split over "ep", equal over "dp"."""
    return DTensor.from_local(tensor, mesh, [Replicate(), Shard(0)], run_check=False)


def _global_state(model: Transformer, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter name, expert weights and their optimizer state
    with their global shape."""
    model_state, optim_state = get_state_dict(model, optimizer)
    for name, (mesh, local_experts) in _expert_meshes(model).items():
        model_state[name] = _as_global(model_state[name], mesh)
        # A copy: get_state_dict hands out the optimizer's own per-parameter dicts, and DTensors left in
        # them would break the next optimizer step.
        per_param = dict(optim_state["state"].get(name, {}))
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == local_experts:
                per_param[key] = _as_global(value, mesh)
        if per_param:
            optim_state["state"][name] = per_param
    return {"model": model_state, "optimizer": optim_state}


def _local_state(state: dict[str, Any], model: Transformer) -> dict[str, Any]:
    """`state` (loaded in place) with the expert weights and their optimizer state back to this rank's
    local tensors, for `set_state_dict`."""
    for name in _expert_meshes(model):
        state["model"][name] = state["model"][name].to_local()
        per_param = state["optimizer"]["state"].get(name, {})
        for key, value in per_param.items():
            if isinstance(value, DTensor):
                per_param[key] = value.to_local()
    return state
