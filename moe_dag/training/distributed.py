"""Every use of torch.distributed in training lives here: process group, data parallelism, reductions.

Launched plainly (`python -m moe_dag.training`) there is one process and no process group. Launched by
torchrun with WORLD_SIZE > 1, each process joins a group (gloo on CPU, NCCL on CUDA) and the model is
wrapped in DistributedDataParallel. Expert parallelism will add its all-to-all here too.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from moe_dag.training.config import DeviceChoice


@dataclass(kw_only=True, slots=True, frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_choice: DeviceChoice) -> DistInfo:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if device_choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda but torch sees no CUDA device")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo", device_id=device if use_cuda else None
        )
    return DistInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        device=device,
    )


def wrap_data_parallel(model: nn.Module, info: DistInfo) -> nn.Module:
    if info.world_size == 1:
        return model
    # Buffers are not broadcast: each rank's expert token counts must survive until the optimizer
    # step sums them, and the expert biases stay equal because every rank applies the same update.
    return DistributedDataParallel(
        model, device_ids=[info.local_rank] if info.device.type == "cuda" else None, broadcast_buffers=False
    )


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Within it, backward all-reduces gradients only if `enabled`: skip it on all but the last
    micro-batch of a gradient-accumulation step."""
    if enabled or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def all_reduce_sum(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def all_reduce_mean(value: float, device: torch.device) -> float:
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.item() / dist.get_world_size()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
