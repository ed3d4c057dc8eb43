"""The training loop: one process per rank, resumable, writing metrics, checkpoints and a summary.

`train(config, data_dir, out_dir)` runs the same way under `python -m moe_dag.training` (one process)
and under `torchrun` (one process per rank, data parallel). If `out_dir` already holds a checkpoint the
run continues from the newest one, so rerunning a finished or killed run is safe and cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training import distributed
from moe_dag.training.allocator import keep_freed_memory
from moe_dag.training.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    read_config,
    save_checkpoint,
)
from moe_dag.training.config import Config
from moe_dag.training.data import MixtureInfo, TrainBatches, read_mixture
from moe_dag.training.health import AnomalyDetector, RouterHealth
from moe_dag.training.load_balance import ExpertBiasUpdater
from moe_dag.training.mfu import peak_flops
from moe_dag.training.model import Transformer, materialise, meta_model
from moe_dag.training.optim import build_optimizer, build_scheduler
from moe_dag.training.parallelize import Parallelism, clip_gradients
from moe_dag.training.params import ParamCounts, count_parameters, flops_per_token
from moe_dag.training.precision import PrecisionRecipe, build_recipe
from moe_dag.training.run_lock import run_lock
from moe_dag.training.run_outputs import MetricsLog, write_plots, write_summary
from moe_dag.training.tracking import start_tracking

log = logging.getLogger(__name__)


def with_data_shapes(config: Config, mixture: MixtureInfo) -> Config:
    """The config with the vocabulary size and sequence length the data was tokenized with."""
    model = dataclasses.replace(config.model, vocab_size=mixture.vocab_size, seq_len=mixture.seq_len)
    return dataclasses.replace(config, model=model)


def threads_per_worker(local_workers: int) -> int:
    """Torch threads for one of `local_workers` processes on this machine: the cores this process may run
    on (a container or taskset can allow fewer than the machine has), split evenly."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // local_workers)


def _num_threads(config: Config, info: distributed.DistInfo) -> int:
    if config.train.num_threads is not None:
        return config.train.num_threads
    return threads_per_worker(info.local_world_size)


def _check_resumable(checkpoint: Path, config: Config) -> None:
    saved = read_config(checkpoint).model
    differing = [
        f.name for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(config.model, f.name)
    ]
    if differing:
        raise ValueError(
            f"{checkpoint}: trained with a different model config (model.{', model.'.join(differing)}); "
            "use a fresh --out directory to train this one"
        )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batches: TrainBatches,
    config: Config,
    device: torch.device,
    recipe: PrecisionRecipe,
    detector: AnomalyDetector | None = None,
    step: int = 0,
    parallel: Parallelism | None = None,
) -> tuple[float, float]:
    """One optimizer step over grad_accum_steps micro-batches; returns (the loss averaged over
    micro-batches and ranks, the gradient norm: of the whole model, every expert counted once, when
    `parallel` is given).

    The forward and loss run under the precision recipe; MoE router losses (when configured) join the
    loss that is differentiated, not the one reported. `detector` sees the loss before the step.
    """
    model.train()
    core: Transformer = getattr(model, "module", model)  # under DDP, the wrapped model
    accum = config.train.grad_accum_steps
    loss_sum = torch.zeros((), device=device)
    for micro in range(accum):
        inputs_BS, targets_BS = (t.to(device, non_blocking=True) for t in batches.next_batch())
        with distributed.gradient_sync(model, enabled=micro == accum - 1):
            with recipe.autocast(device):
                logits_BSV = model(inputs_BS)
                loss = F.cross_entropy(logits_BSV.flatten(0, 1).float(), targets_BS.flatten())
            router_loss = core.router_loss()
            objective = loss if router_loss is None else loss + router_loss
            (objective / accum).backward()
        loss_sum += loss.detach()
    if parallel is None:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    else:
        grad_norm = parallel.finish_gradients(core)
    # Averaged over ranks before any decision, so every rank stops (or not) together.
    mean_loss = distributed.all_reduce_mean((loss_sum / accum).item(), device)
    if detector is not None:
        detector.check(step, mean_loss, core)  # raises before the step when the run must stop
    if config.optim.grad_clip is not None:
        clip_gradients(model.parameters(), config.optim.grad_clip, grad_norm)
    optimizer.step()  # the pre-step hook updates the expert biases first
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss, grad_norm.item()


def train(
    config: Config, data_dir: Path, out_dir: Path, graph: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train (or continue training) to `config.train.steps`; returns the summary written to summary.json.
    `graph`: which run of the launcher's graph this is, for the tracking run (tracking.py).

    Rank 0 holds the run folder's lock throughout: a second trainer on the same folder is refused."""
    info = distributed.init_distributed(config.train.device)
    try:
        with run_lock(Path(out_dir)) if info.is_main else contextlib.nullcontext():
            return _train(config, Path(data_dir), Path(out_dir), info, graph or {})
    finally:
        distributed.shutdown()


@dataclass(kw_only=True, slots=True)
class _Parts:
    model: Transformer
    dp_model: nn.Module  # the model under data parallelism (DDP wrapper, or the model itself)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    balancer: ExpertBiasUpdater
    batches: TrainBatches
    params: ParamCounts
    recipe: PrecisionRecipe
    router_health: RouterHealth
    detector: AnomalyDetector
    parallel: Parallelism


def _build(config: Config, data_dir: Path, info: distributed.DistInfo) -> _Parts:
    torch.manual_seed(config.train.seed)
    recipe = build_recipe(config.precision)
    parallel = Parallelism(config.parallel, info)
    model = meta_model(config.model)
    params = count_parameters(model, config.model)  # before sharding and before the recipe renames any
    parallel.shard_experts(model)  # on the meta model: this rank allocates only its own experts
    materialise(model, info.device)
    recipe.prepare(model)
    dp_model = parallel.wrap(model)  # FSDP2 replaces the parameters: before the optimizer takes them
    optimizer = build_optimizer(model, config.optim)
    all_reduce = distributed.all_reduce_sum if info.world_size > 1 else None
    balancer = ExpertBiasUpdater(
        model.moe_layers(), config.optim.expert_bias_update_rate, all_reduce=all_reduce
    )
    balancer.register(optimizer)
    batches = TrainBatches(
        data_dir, batch_size=config.train.batch_size, rank=info.rank, world_size=info.world_size
    )
    if info.is_main:
        batches.warn_if_repeating(config.train.steps * config.train.grad_accum_steps)
    return _Parts(
        model=model,
        dp_model=dp_model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, config.train.steps, config.optim),
        balancer=balancer,
        batches=batches,
        params=params,
        recipe=recipe,
        router_health=RouterHealth(model, config.health, all_reduce=all_reduce),
        detector=AnomalyDetector(config.health),
        parallel=parallel,
    )


def _resume(parts: _Parts, config: Config, out_dir: Path, info: distributed.DistInfo) -> TrainerState:
    """Load the newest checkpoint in `out_dir` into `parts`, or return the state of a fresh run."""
    checkpoint = latest_checkpoint(out_dir)
    if checkpoint is None:
        return TrainerState(step=0, tokens_seen=0, data=parts.batches.state_dict())
    _check_resumable(checkpoint, config)
    state = load_checkpoint(
        checkpoint, model=parts.model, optimizer=parts.optimizer, scheduler=parts.scheduler, rank=info.rank
    )
    parts.batches.load_state_dict(state.data)
    if info.is_main:
        log.info("resuming from %s (step %d)", checkpoint, state.step)
    return state


def _train(
    config: Config, data_dir: Path, out_dir: Path, info: distributed.DistInfo, graph: dict[str, Any]
) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(_num_threads(config, info))
    keep_freed_memory()  # every step's large tensors reuse freed memory (allocator.py)
    config = with_data_shapes(config, read_mixture(data_dir))
    tc = config.train
    parts = _build(config, data_dir, info)
    state = _resume(parts, config, out_dir, info)
    metrics = MetricsLog(out_dir / "metrics.jsonl")
    if info.is_main:
        metrics.restore(latest_checkpoint(out_dir))
    _replay_health(parts, metrics, state.step)
    token_flops = flops_per_token(config.model)
    peak = peak_flops(info.device, config.precision.recipe, tc.peak_tflops)
    if info.is_main:
        log.info(
            "parameters: %s total, %s active per token; %.3g GFLOP per token (training); precision %s",
            f"{parts.params.total:,}",
            f"{parts.params.active:,}",
            token_flops / 1e9,
            parts.recipe.name,
        )
    tracker = start_tracking(config, out_dir, is_main=info.is_main, graph=graph)
    tokens_per_step = tc.batch_size * tc.grad_accum_steps * info.world_size * config.model.seq_len
    first_step, started = state.step, time.perf_counter()
    while state.step < tc.steps:
        lr = parts.scheduler.get_last_lr()[0]
        step_started = time.perf_counter()
        loss, grad_norm = train_step(
            parts.dp_model,
            parts.optimizer,
            parts.scheduler,
            parts.batches,
            config,
            info.device,
            parts.recipe,
            parts.detector,
            step=state.step + 1,
            parallel=parts.parallel,
        )
        state.step += 1
        state.tokens_seen += tokens_per_step
        state.data = parts.batches.state_dict()
        tokens_per_s = tokens_per_step / (time.perf_counter() - step_started)
        record = {
            "step": state.step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * token_flops / peak if peak else None,
            "load_imbalance": parts.balancer.imbalance,
            "source_shares": parts.batches.source_shares(),
        }
        router = parts.router_health.observe(parts.balancer.load_LE)
        if router is not None:
            record["router"] = router
        if info.is_main:
            metrics.append(record)
            tracker.log(_flat(record), step=state.step)
            if state.step % tc.log_every == 0 or state.step == tc.steps:
                _log_progress(record, tc.steps)
        if state.step % tc.checkpoint_every == 0 or state.step == tc.steps:
            save_checkpoint(
                out_dir,
                config=config,
                state=state,
                model=parts.model,
                optimizer=parts.optimizer,
                scheduler=parts.scheduler,
                rank=info.rank,
                keep=tc.keep_checkpoints,
            )
    wall_seconds = time.perf_counter() - started
    tracker.finish()
    if not info.is_main:
        return {}
    finished_before = _finished_summary(out_dir, state.step) if state.step == first_step else None
    if finished_before is not None:  # resumed at its last step: the timings are those of the training
        return finished_before
    run = {
        "steps": state.step,
        "steps_this_run": state.step - first_step,
        "tokens_seen": state.tokens_seen,
        "wall_seconds": wall_seconds,
        "steps_per_second": (state.step - first_step) / wall_seconds if state.step > first_step else None,
        "world_size": info.world_size,
        "device": str(info.device),
    }
    return _write_outputs(out_dir, metrics, run, parts.params, config, data_dir)


def _finished_summary(out_dir: Path, step: int) -> dict[str, Any] | None:
    """The summary of a run that already finished at `step`, if it was written."""
    path = out_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("steps") == step else None


def _replay_health(parts: _Parts, metrics: MetricsLog, step: int) -> None:
    """On resume, refill the health windows from the logged steps up to `step`."""
    if step == 0 or not metrics.path.exists():
        return
    records = [record for record in metrics.read() if record["step"] <= step]
    parts.router_health.replay(records)
    parts.detector.replay(records)


def _write_outputs(
    out_dir: Path,
    metrics: MetricsLog,
    run: dict[str, Any],
    params: ParamCounts,
    config: Config,
    data_dir: Path,
) -> dict[str, Any]:
    """summary.json and loss.png, both derived from metrics.jsonl so reruns and resumes agree."""
    records = metrics.read()
    last, checkpoint = records[-10:], latest_checkpoint(out_dir)
    summary = {
        "final_train_loss": records[-1]["loss"] if records else None,
        "final_train_loss_mean_last_10": sum(r["loss"] for r in last) / len(last) if last else None,
        **run,
        "params": params.as_dict(),
        "checkpoint": str(checkpoint) if checkpoint else None,
        "data_dir": str(data_dir),
        "config": config.to_dict(),
    }
    write_summary(out_dir / "summary.json", summary)
    if records:
        title = f"{params.total:,} params ({params.active:,} active), {run['tokens_seen']:,} tokens"
        write_plots(records, out_dir, title=title, target_shares=read_mixture(data_dir).target_shares)
    return summary


def _flat(record: dict[str, Any]) -> dict[str, float]:
    skipped = ("step", "load_imbalance", "router", "source_shares")
    flat = {key: value for key, value in record.items() if key not in skipped}
    flat.update({f"load_imbalance/layer_{i}": value for i, value in enumerate(record["load_imbalance"])})
    flat.update({f"source_share/{name}": share for name, share in record.get("source_shares", {}).items()})
    router = record.get("router")
    if router is not None:
        for key in ("max_over_mean", "dead_experts", "entropy", "bias_min", "bias_max", "dropped_fraction"):
            values = zip(router["layers"], router[key], strict=True)
            flat.update({f"router/{key}/layer_{layer}": value for layer, value in values})
    return flat


def _log_progress(record: dict[str, Any], total_steps: int) -> None:
    imbalance = max(record["load_imbalance"], default=1.0)
    router = record.get("router") or {}
    log.info(
        "step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  tokens/s %.0f  MFU %s  max expert load/mean %.2f"
        "  dead experts %d  router entropy %s",
        record["step"],
        total_steps,
        record["loss"],
        record["lr"],
        record["grad_norm"],
        record["tokens_per_s"],
        f"{record['mfu']:.1%}" if record["mfu"] is not None else "n/a",
        imbalance,
        sum(router.get("dead_experts", [])),
        " ".join(f"{v:.2f}" for v in router.get("entropy", [])) or "n/a",
    )
