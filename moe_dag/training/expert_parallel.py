"""Expert parallelism: an MoE layer's routed experts split over a process group, tokens sent all-to-all.

With P ranks in the expert-parallel group and E experts, the rank at position p holds the L = E / P
experts [p L, (p + 1) L). Every rank routes its own tokens, then `ExpertParallelDispatch`:

1. sorts its (token, expert) pairs by expert (`permute`); experts are numbered by owner, so the rows
   are also sorted by destination rank;
2. exchanges the per-expert row counts (one small all-to-all): each rank learns how many rows every
   source sends to each of its local experts, and both sides know the split sizes (the one host sync);
3. sends the rows with `all_to_all_single` and uneven splits;
4. groups the arrived rows, ordered (source, local expert), by local expert (`permute` with one choice
   per row: stable, so by source rank and then token order within an expert) and runs the experts;
5. combines in reverse: rows back to arrival order, all-to-all back with the splits swapped, and
   `unpermute` weights them by their gates and sums each token's top k in original token order.

Autograd runs through both exchanges: `_AllToAll`'s backward is the all-to-all with the splits swapped.
No step loops over tokens in Python.

FP8 dispatch (`parallel.fp8_dispatch`, DeepSeek-V3 arXiv:2412.19437 sec. 3.3): rows are quantised to
e4m3 with a float32 scale per 1x128 tile (`quantize_fp8_blockwise`: the Triton kernel on a GPU, the
bit-identical PyTorch reference on CPU) and sent as one byte buffer (values then scales per row), about
half of bf16's bytes; the arrived rows are dequantised (`dequantize_fp8_blockwise`) into the compute
dtype right before the experts' first grouped product. The gradient crosses back unquantised, as
DeepSeek-V3's combine does, and passes the rounding straight through. A group of one rank runs the
same steps without communication, so EP=1 and EP=P runs with FP8 dispatch see the same numbers.

Shape legend: N tokens, K experts per token, D width, E experts, M sorted rows sent, R rows received,
P ranks in the group, L local experts, Db 128-wide tiles of D.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from moe_dag.kernels import (
    ACTIVATION_BLOCK,
    dequantize_fp8_blockwise,
    permute,
    quantize_fp8_blockwise,
)
from moe_dag.kernels.fp8 import FP8_DTYPE
from moe_dag.training.moe import sort_pairs, unsort_pairs


def _all_to_all(
    x: torch.Tensor, output_splits: list[int], input_splits: list[int], group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Rows x[input_splits[i] rows] to rank i of `group`; returns the rows received, by source rank."""
    if group is None:
        return x
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


def _fp8_all_to_all(
    x_MD: torch.Tensor, output_splits: list[int], input_splits: list[int], group: dist.ProcessGroup | None
) -> torch.Tensor:
    """`_all_to_all` of x quantised to e4m3 (values, then float32 scales, as one byte row), dequantised
    on arrival into x's dtype."""
    D = x_MD.shape[1]
    q_MD, scale_MDb = quantize_fp8_blockwise(x_MD, ACTIVATION_BLOCK)
    packed = torch.cat((q_MD.view(torch.uint8), scale_MDb.view(torch.uint8)), dim=1)
    received = _all_to_all(packed, output_splits, input_splits, group)
    q_RD = received[:, :D].contiguous().view(FP8_DTYPE)
    scale_RDb = received[:, D:].contiguous().view(torch.float32)
    return dequantize_fp8_blockwise(q_RD, scale_RDb, ACTIVATION_BLOCK, x_MD.dtype)


class _AllToAll(torch.autograd.Function):
    """Forward: rows to ranks by split sizes (in FP8 when `fp8`). Backward: the gradient goes back
    unquantised with the splits swapped (through the FP8 rounding as if it were not there)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, output_splits: list[int], input_splits: list[int], group: Any, fp8: bool
    ) -> torch.Tensor:
        ctx.splits, ctx.group = (output_splits, input_splits), group
        exchange = _fp8_all_to_all if fp8 else _all_to_all
        return exchange(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        output_splits, input_splits = ctx.splits
        return _all_to_all(grad, input_splits, output_splits, ctx.group), None, None, None, None


class ExpertParallelDispatch:
    """`MoE.dispatch` for experts split over the "ep" dimension of `mesh` (a ("dp", "ep") mesh; None in a
    single process): this rank's experts are [first_expert, first_expert + local_experts)."""

    def __init__(self, mesh: DeviceMesh | None, *, num_experts: int, drops_pairs: bool, fp8: bool) -> None:
        self.mesh = mesh
        ep_mesh = None if mesh is None else mesh["ep"]
        self.ranks = 1 if ep_mesh is None else ep_mesh.size()
        if num_experts % self.ranks:
            raise ValueError(f"model.num_experts={num_experts} must be divisible by parallel.ep={self.ranks}")
        self.group = ep_mesh.get_group() if self.ranks > 1 else None
        position = 0 if ep_mesh is None else ep_mesh.get_local_rank()
        self.num_experts, self.drops_pairs, self.fp8 = num_experts, drops_pairs, fp8
        self.local_experts = num_experts // self.ranks
        self.first_expert = position * self.local_experts

    def __call__(
        self, experts: nn.Module, x_ND: torch.Tensor, expert_NK: torch.Tensor, gate_NK: torch.Tensor
    ) -> torch.Tensor:
        P, L = self.ranks, self.local_experts
        pairs = sort_pairs(x_ND, expert_NK, self.num_experts, self.drops_pairs)
        sent_PL = pairs.counts_E.view(P, L)
        received_PL = _all_to_all(sent_PL, [1] * P, [1] * P, self.group)
        send_splits, receive_splits = torch.stack((sent_PL.sum(1), received_PL.sum(1))).tolist()
        x_RD = _AllToAll.apply(pairs.x_MD, receive_splits, send_splits, self.group, self.fp8)
        local_expert_R = torch.repeat_interleave(
            torch.arange(L, device=x_RD.device).repeat(P), received_PL.flatten(), output_size=x_RD.shape[0]
        )
        x_by_expert_RD, counts_L, row_R1 = permute(x_RD, local_expert_R[:, None], L)
        y_RD = experts(x_by_expert_RD, counts_L).index_select(0, row_R1.view(-1))
        y_MD = _AllToAll.apply(y_RD, send_splits, receive_splits, self.group, False)
        return unsort_pairs(y_MD, pairs, gate_NK)
