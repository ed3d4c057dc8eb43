"""The process group and the collectives the training loop uses.

Launched plainly (`python -m moe_dag.training`) there is one process and no process group. Launched by
torchrun with WORLD_SIZE > 1, each process joins a group: NCCL when it trains on a CUDA device, gloo on
CPU. How the model is spread over the processes (expert and data parallelism) is `parallelize.py`'s;
the expert all-to-all is `expert_parallel.py`'s.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
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


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Within it, backward reduces gradients over data-parallel ranks only if `enabled`: skip it on all
    but the last micro-batch of a gradient-accumulation step."""
    if enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


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
