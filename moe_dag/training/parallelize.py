"""Parallelism applied to a model from outside: process groups, expert sharding, data parallelism.

`parallel.ep` = P over W processes lays the ranks out on a (W / P, P) mesh named ("dp", "ep"):
rank = replica * P + position. An EP group is P consecutive ranks (one node's GPUs when P <= GPUs per
node, so the all-to-all stays on NVLink); a replica group is the W / P ranks that hold the same experts.
Every rank reads its own batch (data parallelism over all W ranks).

| parameters     | held                                         | gradients                                  |
| -------------- | -------------------------------------------- | ------------------------------------------ |
| routed experts | E / P per rank, split over the EP group,     | the all-to-all backward brings each expert |
|                | replicated over the replica group            | the gradient of every token its EP group   |
|                |                                              | sent it; `finish_gradients` sums them over |
|                |                                              | replicas and divides by W                  |
| everything     | every rank: DistributedDataParallel replicas | averaged over all W ranks by DDP or FSDP   |
| else           | or FSDP2 shards (`parallel.data_parallel`):  |                                            |
|                | over all W ranks (fsdp), or over the ranks   |                                            |
|                | of a node, replicated across nodes (hsdp)    |                                            |

Dividing the expert gradients by W makes them what one process would compute on the W batches
together, as DDP's average does for the dense parts. Each rank narrows the experts of the model while
it is still on the meta device, then materialises it: only its own experts are allocated and drawn, with
the values a whole build gives them (`slice_init.py`), so every EP size starts from the same weights
and no rank ever holds the whole expert stack. (`shard_experts` on a built model slices it instead.)

Use, in this order:

    parallel = Parallelism(config.parallel, info)
    model = meta_model(...); parallel.shard_experts(model)       # before the recipe and the optimizer
    materialise(model, device)
    recipe.prepare(model); optimizer = build_optimizer(model, ...)
    wrapped = parallel.wrap(model)                                # DDP, FSDP2, or the model itself
    per step: backward under distributed.gradient_sync(wrapped, ...); then
              grad_norm = parallel.finish_gradients(model)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from moe_dag.training.config import ParallelConfig
from moe_dag.training.distributed import DistInfo
from moe_dag.training.expert_parallel import ExpertParallelDispatch
from moe_dag.training.model import Transformer
from moe_dag.training.moe import RoutedExperts


class Parallelism:
    def __init__(self, config: ParallelConfig, info: DistInfo) -> None:
        if info.world_size % config.ep:
            raise ValueError(
                f"parallel.ep={config.ep} must divide the number of processes ({info.world_size})"
            )
        self.config, self.info = config, info
        if config.data_parallel == "hsdp" and info.world_size % info.local_world_size:
            raise ValueError(
                f"parallel.data_parallel=hsdp needs the same processes on every node: {info.world_size} "
                f"processes are not a multiple of {info.local_world_size} per node"
            )
        self.mesh: DeviceMesh | None = None
        self.ep_group = self.replica_group = None
        # The ranks over which one FSDP2 parameter is sharded: its gradient's squares sum over them.
        self.shard_group: dist.ProcessGroup | None = None
        if info.world_size > 1:
            self.mesh = init_device_mesh(
                info.device.type, (info.world_size // config.ep, config.ep), mesh_dim_names=("dp", "ep")
            )
            if config.ep > 1:
                self.ep_group = self.mesh.get_group("ep")
            if info.world_size > config.ep:
                self.replica_group = self.mesh.get_group("dp")

    @property
    def splits_experts(self) -> bool:
        """Whether MoE layers dispatch through `ExpertParallelDispatch` (EP > 1, or FP8 dispatch)."""
        return self.config.ep > 1 or self.config.fp8_dispatch

    def shard_experts(self, model: Transformer) -> None:
        """Keep this rank's experts of every MoE layer and dispatch to the others all-to-all; on a meta
        model (`model.meta_model`), before `materialise`, so only those experts are ever allocated."""
        if not self.splits_experts:
            return
        for moe in model.moe_layers():
            if not isinstance(moe.experts, RoutedExperts):
                raise ValueError(
                    "expert parallelism shards RoutedExperts' stacked weights: call shard_experts "
                    "before the precision recipe converts the experts"
                )
            dispatch = ExpertParallelDispatch(
                self.mesh,
                num_experts=moe.num_experts,
                drops_pairs=moe.capacity_factor is not None,
                fp8=self.config.fp8_dispatch,
            )
            moe.experts.keep(dispatch.first_expert, dispatch.local_experts)
            moe.dispatch = dispatch

    def expert_parameters(self, model: Transformer) -> list[nn.Parameter]:
        """The parameters of the experts behind an `ExpertParallelDispatch` (whatever module the
        precision recipe made of them)."""
        return [
            parameter
            for moe in model.moe_layers()
            if isinstance(moe.dispatch, ExpertParallelDispatch)
            for parameter in moe.experts.parameters()
        ]

    def wrap(self, model: Transformer) -> nn.Module:
        """The model under data parallelism: DDP (experts left out) or FSDP2 shards, in place."""
        if self.mesh is None:
            return model
        split = [moe for moe in model.moe_layers() if isinstance(moe.dispatch, ExpertParallelDispatch)]
        if any(not isinstance(moe.experts, RoutedExperts) for moe in split):
            raise ValueError(
                "expert parallelism over several processes checkpoints stacked expert weights; the "
                "Transformer Engine recipes (precision.recipe fp8, nvfp4) keep one weight per local "
                "expert instead: use them with parallel.ep=1 and parallel.fp8_dispatch=false, or EP with "
                "bf16 or fp8-emulated"
            )
        experts = self.expert_parameters(model)
        if self.config.data_parallel in ("fsdp", "hsdp"):
            mesh = self._dense_mesh()
            self.shard_group = mesh.get_group(mesh.ndim - 1)
            for block in model.layers:
                fully_shard(block, mesh=mesh, ignored_params=set(experts))
            fully_shard(model, mesh=mesh, ignored_params=set(experts))
            return model
        expert_ids = {id(p) for p in experts}
        ignored = [name for name, p in model.named_parameters() if id(p) in expert_ids]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
        # Buffers are not broadcast: each rank's expert token counts must survive until the optimizer
        # step sums them, and the expert biases stay equal because every rank applies the same update.
        # (torch 2.13 deprecates the flag, and says to keep it for rank-local buffers until its
        # replacement can skip the sync at construction.)
        device_ids = [self.info.local_rank] if self.info.device.type == "cuda" else None
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning
            )
            return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)

    def _dense_mesh(self) -> DeviceMesh:
        """FSDP2's mesh: all ranks (fsdp), or (nodes, processes per node) (hsdp), on which fully_shard
        replicates over the first dimension and shards over the second."""
        if self.config.data_parallel == "fsdp":
            return init_device_mesh(self.info.device.type, (self.info.world_size,))
        nodes = self.info.world_size // self.info.local_world_size
        return init_device_mesh(
            self.info.device.type, (nodes, self.info.local_world_size), mesh_dim_names=("replicate", "shard")
        )

    @torch.no_grad()
    def finish_gradients(self, model: Transformer) -> torch.Tensor:
        """After a step's last backward: expert gradients summed over replicas and divided by the
        world size; returns the global gradient norm (the same on every rank)."""
        experts = self.expert_parameters(model)
        for parameter in experts:  # a rank that received no rows still joins the reductions
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        expert_ids = {id(p) for p in experts}
        expert_grads = [p.grad for p in experts]
        dense_grads = [p.grad for p in model.parameters() if id(p) not in expert_ids and p.grad is not None]
        if self.mesh is None:
            return torch.nn.utils.get_total_norm(dense_grads + expert_grads)
        if expert_grads:
            flat = torch._utils._flatten_dense_tensors(expert_grads).div_(self.info.world_size)
            if self.replica_group is not None:
                dist.all_reduce(flat, group=self.replica_group)
            for grad, reduced in zip(
                expert_grads, torch._utils._unflatten_dense_tensors(flat, expert_grads), strict=True
            ):
                grad.copy_(reduced)
        return (self._squared_norm(dense_grads) + self._squared_norm(expert_grads, self.ep_group)).sqrt()

    def _squared_norm(
        self, grads: list[torch.Tensor], group: dist.ProcessGroup | None = None
    ) -> torch.Tensor:
        """Sum of squares of `grads`, summed over `group`; FSDP shards (DTensors) over the ranks they are
        sharded over (every rank for fsdp, a node's for hsdp, whose nodes hold replicas)."""
        if any(isinstance(g, DTensor) for g in grads):
            grads, group = [g.to_local() if isinstance(g, DTensor) else g for g in grads], self.shard_group
        squared = torch.nn.utils.get_total_norm(grads).to(self.info.device).square()
        if group is not None:
            dist.all_reduce(squared, group=group)
        return squared


@torch.no_grad()
def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale every gradient by min(1, max_norm / total_norm), as torch's `clip_grads_with_norm_` does,
    with FSDP2's DTensor gradients and plain ones (expert-parallel experts) in separate foreach calls:
    one call cannot take both."""
    coefficient = min(1.0, max_norm / (float(total_norm) + 1e-6))
    grads = [p.grad for p in parameters if p.grad is not None]
    for kind in (
        [g for g in grads if isinstance(g, DTensor)],
        [g for g in grads if not isinstance(g, DTensor)],
    ):
        if kind:
            torch._foreach_mul_(kind, coefficient)
