"""Training over several nodes: hybrid sharding (FSDP2 over a (nodes, processes per node) mesh) follows
one process step by step, with and without expert parallelism; and the `moe_proxy` asset's launch of 2
"nodes" x 2 processes over gloo, every node's torchrun agent on this machine, meeting by c10d rendezvous.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_expert_parallel import check_training, spawn
from torch.distributed.tensor import Replicate, Shard

from moe_dag.training.config import ParallelConfig, tiny
from moe_dag.training.distributed import DistInfo
from moe_dag.training.model import build_model
from moe_dag.training.parallelize import Parallelism

NODES, PER_NODE = 2, 2


def _two_nodes_of_two(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    info = DistInfo(
        rank=rank,
        world_size=world,
        local_rank=rank % PER_NODE,
        local_world_size=PER_NODE,
        device=torch.device("cpu"),
    )
    try:
        hybrid = ParallelConfig(data_parallel="hsdp")
        model = build_model(tiny().model)
        Parallelism(hybrid, info).wrap(model)
        embedding = next(model.parameters())
        assert embedding.device_mesh.shape == (NODES, PER_NODE)
        assert embedding.placements == (Replicate(), Shard(0))  # replicated over nodes, sharded within
        check_training(info, hybrid, grad_accum_steps=2, grad_clip=0.05)
        # EP groups of 2 consecutive ranks (one node's), experts replicated across the nodes.
        check_training(info, ParallelConfig(ep=2, data_parallel="hsdp"), grad_accum_steps=1, grad_clip=0.05)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_hybrid_sharding_over_two_nodes_of_two_follows_one_process() -> None:
    spawn(_two_nodes_of_two, NODES * PER_NODE)
