"""Permute tokens into expert-sorted order and back: Triton kernels beside the plain-PyTorch references.

`permute` copies each token once for every expert it chose, grouped by expert (each expert's rows
contiguous, in token order within an expert: a stable sort), so a grouped GEMM can run every expert on
one slice. It returns the inverse index row_NK: where pair (token n, choice k) landed in sorted order.
`unpermute` brings the expert outputs home: y_N = sum over k of gate_NK * y_M[row_NK]. Both directions
are gathers or scatters through row_NK, which makes the backward passes the same kernels turned round:

    permute forward     x_M[row_NK[n, k]] = x_N[n]                       (scatter)
    permute backward    dx_N[n] = sum_k dx_M[row_NK[n, k]]               (gather-sum, no gate)
    unpermute forward   y_N[n] = sum_k gate_NK[n, k] y_M[row_NK[n, k]]   (gather-sum)
    unpermute backward  dy_M[row_NK[n, k]] = gate_NK[n, k] dy_N[n],      (scatter, and in the same pass)
                        dgate_NK[n, k] = <dy_N[n], y_M[row_NK[n, k]]>

Every token's sum is done by the one program that owns the token, in a fixed order: no atomics, so the
results are deterministic. The sort itself is a counting sort in two kernels: a histogram of experts per
block of pairs, then each pair's row = start of its expert + pairs of that expert in earlier blocks +
its rank within its block (a cumulative sum over a one-hot block).

Shape legend: N tokens, D width, K experts chosen per token, M sorted rows (N * K), E experts,
B blocks of pairs in the counting sort.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from moe_dag.kernels.backend import autotune_configs, triton_runs_on

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The counting sort holds a block of pairs x all experts as a one-hot tile.
MAX_EXPERTS = 1024


def _check_routing(x_ND: torch.Tensor, expert_NK: torch.Tensor, num_experts: int) -> None:
    if x_ND.dim() != 2 or expert_NK.dim() != 2 or expert_NK.shape[0] != x_ND.shape[0]:
        raise ValueError(
            f"permute needs x of shape (N, D) and expert ids of shape (N, K), got x {tuple(x_ND.shape)} "
            f"and expert ids {tuple(expert_NK.shape)}"
        )
    if expert_NK.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"permute needs integer expert ids, got {expert_NK.dtype}")
    if num_experts < 1:
        raise ValueError(f"permute needs num_experts >= 1, got {num_experts}")


def _check_unpermute(y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor | None) -> None:
    if y_MD.dim() != 2 or row_NK.dim() != 2:
        raise ValueError(
            f"unpermute needs sorted rows of shape (M, D) and row_NK of shape (N, K), got "
            f"{tuple(y_MD.shape)} and {tuple(row_NK.shape)}"
        )
    if gate_NK is not None and gate_NK.shape != row_NK.shape:
        raise ValueError(
            f"unpermute needs gates shaped like row_NK {tuple(row_NK.shape)}, got {tuple(gate_NK.shape)}"
        )
    if y_MD.shape[0] != row_NK.numel():
        raise ValueError(
            f"unpermute needs one sorted row per (token, choice) pair: {row_NK.numel()} pairs, "
            f"got {y_MD.shape[0]} rows"
        )


def permute_reference(
    x_ND: torch.Tensor, expert_NK: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain PyTorch: (x_MD, counts_E int32, row_NK int32) by a stable argsort of the expert ids."""
    _check_routing(x_ND, expert_NK, num_experts)
    N, K = expert_NK.shape
    order_M = expert_NK.flatten().argsort(stable=True)
    row_M = torch.arange(N * K, device=x_ND.device, dtype=torch.int32)
    row_NK = torch.empty_like(row_M).scatter_(0, order_M, row_M).view(N, K)
    counts_E = torch.bincount(expert_NK.flatten(), minlength=num_experts).to(torch.int32)
    return x_ND.index_select(0, order_M // K), counts_E, row_NK


class _UnpermuteReference(torch.autograd.Function):
    """The unpermute formulas above as `embedding_bag` calls, fused C++ loops on CPU, where this
    reference is what trains: against the same formulas in eager tensor operations (gather, scale, sum,
    a pass over memory each) they took 1.1 ms off a 26 ms forward and backward of the demo MoE layer on
    one thread. Forward, each token is a bag of its K sorted rows weighted by its gates. Backward, since
    row_NK is a permutation of the M rows, the scatter is a gather: each sorted row a bag of one token
    row, weighted by that pair's gate (autograd of `embedding_bag` zero-fills and sorts for a general
    scatter-add instead)."""

    @staticmethod
    def forward(ctx, y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(y_MD, row_NK, gate_NK)
        return F.embedding_bag(row_NK, y_MD, per_sample_weights=gate_NK, mode="sum")

    @staticmethod
    def backward(ctx, dy_ND: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor | None]:
        y_MD, row_NK, gate_NK = ctx.saved_tensors
        N, K = row_NK.shape
        row_M = row_NK.view(-1).long()
        pair_token_M = torch.arange(N * K, device=row_M.device) // K  # the token of pair n * K + k
        dy_MD = dgate_NK = None
        if ctx.needs_input_grad[0]:
            token_M = torch.empty_like(row_M).scatter_(0, row_M, pair_token_M)
            gate_M = torch.empty_like(gate_NK.view(-1)).scatter_(0, row_M, gate_NK.view(-1))
            dy_MD = F.embedding_bag(
                token_M.view(-1, 1), dy_ND, per_sample_weights=gate_M.view(-1, 1), mode="sum"
            )
        if ctx.needs_input_grad[2]:  # what autograd of embedding_bag calls: <dy_N[n], y_M[row_NK[n, k]]>
            offsets_N = torch.arange(0, N * K, K, device=row_M.device)
            dgate_NK = torch.ops.aten._embedding_bag_per_sample_weights_backward(
                dy_ND, y_MD, row_M, offsets_N, pair_token_M, 0
            ).view(N, K)
        return dy_MD, None, dgate_NK


def unpermute_reference(y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: y_ND = sum over k of gate_NK * y_MD[row_NK], summed in float32 (or float64) and
    returned in y_MD's dtype, with the backward written out (tested against autograd of that
    expression). row_NK must be a permutation of y_MD's rows, as `permute` returns it."""
    _check_unpermute(y_MD, row_NK, gate_NK)
    compute_dtype = torch.promote_types(y_MD.dtype, torch.float32)
    y_ND = _UnpermuteReference.apply(y_MD.to(compute_dtype), row_NK, gate_NK.to(compute_dtype))
    return y_ND.to(y_MD.dtype)


@triton.jit
def _expert_histogram_kernel(expert_ptr, hist_ptr, M, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    block = tl.program_id(0).to(tl.int64)
    pairs = block * BLOCK_M + tl.arange(0, BLOCK_M)
    experts = tl.arange(0, BLOCK_E)
    expert = tl.load(expert_ptr + pairs, mask=pairs < M, other=0).to(tl.int32)
    hist = tl.histogram(expert, BLOCK_E, mask=pairs < M)
    tl.store(hist_ptr + block * E + experts, hist, mask=experts < E)


@triton.jit
def _sorted_row_kernel(
    expert_ptr, block_start_ptr, row_ptr, M, E, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr
):
    block = tl.program_id(0).to(tl.int64)
    pairs = block * BLOCK_M + tl.arange(0, BLOCK_M)
    in_pairs = pairs < M
    expert = tl.load(expert_ptr + pairs, mask=in_pairs, other=0)
    one_hot = ((expert[:, None] == tl.arange(0, BLOCK_E)[None, :]) & in_pairs[:, None]).to(tl.int32)
    rank = tl.sum(tl.cumsum(one_hot, axis=0) * one_hot, axis=1) - 1
    start = tl.load(block_start_ptr + block * E + expert, mask=in_pairs, other=0)
    tl.store(row_ptr + pairs, (start + rank).to(tl.int32), mask=in_pairs)


_ROW_CONFIGS = autotune_configs(
    [triton.Config({"BLOCK_D": d}, num_warps=w) for d in (256, 512, 1024, 2048) for w in (2, 4, 8)],
    interpreted=triton.Config({"BLOCK_D": 32}),
)


@triton.jit
def _token_choices(row_ptr, gate_ptr, token, K, HAS_GATE: tl.constexpr, BLOCK_K: tl.constexpr):
    """A token's K choices padded to BLOCK_K: slot index, which slots are real, sorted rows, gates (1
    without gates, 0 in padding)."""
    chosen = tl.arange(0, BLOCK_K)
    in_k = chosen < K
    row = tl.load(row_ptr + token * K + chosen, mask=in_k, other=0).to(tl.int64)
    if HAS_GATE:
        gate = tl.load(gate_ptr + token * K + chosen, mask=in_k, other=0.0).to(tl.float32)
    else:
        gate = tl.where(in_k, 1.0, 0.0)
    return chosen, in_k, row, gate


@triton.autotune(configs=_ROW_CONFIGS, key=["D", "K", "HAS_GATE", "WITH_DGATE"])
@triton.jit
def _scatter_rows_kernel(
    src_ptr, row_ptr, gate_ptr, dst_ptr, dot_ptr, dgate_ptr, D, K,
    HAS_GATE: tl.constexpr, WITH_DGATE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """dst[row_NK[n, k]] = gate_NK[n, k] * src[n]; WITH_DGATE also dgate_NK[n, k] = <src[n], dot[row]>."""
    token = tl.program_id(0).to(tl.int64)
    chosen, in_k, row, gate = _token_choices(row_ptr, gate_ptr, token, K, HAS_GATE, BLOCK_K)
    dgate = tl.zeros([BLOCK_K], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        in_cols = cols < D
        in_KD = in_k[:, None] & in_cols[None, :]
        src = tl.load(src_ptr + token * D + cols, mask=in_cols, other=0.0).to(tl.float32)
        at_KD = row[:, None] * D + cols[None, :]
        tl.store(dst_ptr + at_KD, (gate[:, None] * src[None, :]).to(dst_ptr.dtype.element_ty), mask=in_KD)
        if WITH_DGATE:
            dot_KD = tl.load(dot_ptr + at_KD, mask=in_KD, other=0.0).to(tl.float32)
            dgate += tl.sum(dot_KD * src[None, :], axis=1)
    if WITH_DGATE:
        tl.store(
            dgate_ptr + token * K + tl.arange(0, BLOCK_K), dgate.to(dgate_ptr.dtype.element_ty), mask=in_k
        )


@triton.autotune(configs=_ROW_CONFIGS, key=["D", "K", "HAS_GATE"])
@triton.jit
def _gather_sum_kernel(
    src_ptr, row_ptr, gate_ptr, dst_ptr, D, K, HAS_GATE: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """dst[n] = sum over k of gate_NK[n, k] * src[row_NK[n, k]], in float32."""
    token = tl.program_id(0).to(tl.int64)
    chosen, in_k, row, gate = _token_choices(row_ptr, gate_ptr, token, K, HAS_GATE, BLOCK_K)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        in_cols = cols < D
        src_KD = tl.load(
            src_ptr + row[:, None] * D + cols[None, :], mask=in_k[:, None] & in_cols[None, :], other=0.0
        )
        dst = tl.sum(gate[:, None] * src_KD.to(tl.float32), axis=0)
        tl.store(dst_ptr + token * D + cols, dst.to(dst_ptr.dtype.element_ty), mask=in_cols)


@torch.library.custom_op("moe_dag::sort_by_expert", mutates_args=())
def sort_by_expert(expert_NK: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counting sort of the (token, choice) pairs by expert: (row_NK int32, counts_E int32)."""
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"the permute kernels take up to {MAX_EXPERTS} experts, got {num_experts}")
    N, K = expert_NK.shape
    M, E = N * K, num_experts
    block_e = triton.next_power_of_2(E)
    block_m = max(16, min(256, 8192 // block_e))
    blocks = triton.cdiv(M, block_m)
    expert_M = expert_NK.contiguous().view(-1)
    hist_BE = torch.empty(blocks, E, dtype=torch.int32, device=expert_NK.device)
    _expert_histogram_kernel[(blocks,)](expert_M, hist_BE, M, E, BLOCK_M=block_m, BLOCK_E=block_e)
    counts_E = hist_BE.sum(0, dtype=torch.int32)
    expert_start_E = counts_E.cumsum(0, dtype=torch.int32) - counts_E
    block_start_BE = hist_BE.cumsum(0, dtype=torch.int32) - hist_BE + expert_start_E
    row_NK = torch.empty(N, K, dtype=torch.int32, device=expert_NK.device)
    _sorted_row_kernel[(blocks,)](expert_M, block_start_BE, row_NK, M, E, BLOCK_M=block_m, BLOCK_E=block_e)
    return row_NK, counts_E


@sort_by_expert.register_fake
def _(expert_NK: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(expert_NK, dtype=torch.int32), expert_NK.new_empty(num_experts, dtype=torch.int32)


@torch.library.custom_op("moe_dag::scatter_rows", mutates_args=())
def scatter_rows(x_ND: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor | None) -> torch.Tensor:
    """x_MD[row_NK[n, k]] = gate_NK[n, k] (1 without gates) * x_ND[n]: every token copied to the rows
    of its K choices."""
    N, K = row_NK.shape
    x_MD = x_ND.new_empty(N * K, x_ND.shape[1])
    _scatter_rows_kernel[(N,)](
        x_ND.contiguous(), row_NK.contiguous(), gate_NK.contiguous() if gate_NK is not None else x_ND, x_MD,
        x_ND, x_ND, x_ND.shape[1], K, HAS_GATE=gate_NK is not None, WITH_DGATE=False,
        BLOCK_K=triton.next_power_of_2(K),
    )  # fmt: skip
    return x_MD


@scatter_rows.register_fake
def _(x_ND: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor | None) -> torch.Tensor:
    return x_ND.new_empty(row_NK.numel(), x_ND.shape[1])


@torch.library.custom_op("moe_dag::gather_sum_rows", mutates_args=())
def gather_sum_rows(y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor | None) -> torch.Tensor:
    """y_ND[n] = sum over k of gate_NK[n, k] (1 without gates) * y_MD[row_NK[n, k]]."""
    N, K = row_NK.shape
    y_ND = y_MD.new_empty(N, y_MD.shape[1])
    _gather_sum_kernel[(N,)](
        y_MD.contiguous(), row_NK.contiguous(), gate_NK.contiguous() if gate_NK is not None else y_MD,
        y_ND, y_MD.shape[1], K, HAS_GATE=gate_NK is not None, BLOCK_K=triton.next_power_of_2(K),
    )  # fmt: skip
    return y_ND


@gather_sum_rows.register_fake
def _(y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor | None) -> torch.Tensor:
    return y_MD.new_empty(row_NK.shape[0], y_MD.shape[1])


@torch.library.custom_op("moe_dag::unpermute_backward", mutates_args=())
def unpermute_backward(
    dy_ND: torch.Tensor, y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dy_MD, dgate_NK) in one pass over dy_ND."""
    N, K = row_NK.shape
    dy_MD = y_MD.new_empty(y_MD.shape)
    dgate_NK = torch.empty_like(gate_NK)
    _scatter_rows_kernel[(N,)](
        dy_ND.contiguous(), row_NK.contiguous(), gate_NK.contiguous(), dy_MD, y_MD.contiguous(), dgate_NK,
        y_MD.shape[1], K, HAS_GATE=True, WITH_DGATE=True, BLOCK_K=triton.next_power_of_2(K),
    )  # fmt: skip
    return dy_MD, dgate_NK


@unpermute_backward.register_fake
def _(
    dy_ND: torch.Tensor, y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return y_MD.new_empty(y_MD.shape), torch.empty_like(gate_NK)


def _scatter_setup_context(ctx, inputs, output) -> None:
    _x_ND, row_NK, gate_NK = inputs
    ctx.save_for_backward(row_NK, gate_NK)


def _scatter_backward(ctx, dx_MD: torch.Tensor):
    row_NK, gate_NK = ctx.saved_tensors
    if ctx.needs_input_grad[2]:
        raise NotImplementedError(
            "scatter_rows gives no gradient to its gates; unpermute is where gates learn"
        )
    return gather_sum_rows(dx_MD, row_NK, gate_NK), None, None


scatter_rows.register_autograd(_scatter_backward, setup_context=_scatter_setup_context)


def _gather_setup_context(ctx, inputs, output) -> None:
    y_MD, row_NK, gate_NK = inputs
    ctx.save_for_backward(y_MD, row_NK, gate_NK)


def _gather_backward(ctx, dy_ND: torch.Tensor):
    y_MD, row_NK, gate_NK = ctx.saved_tensors
    if gate_NK is None or not ctx.needs_input_grad[2]:
        return scatter_rows(dy_ND, row_NK, gate_NK), None, None
    dy_MD, dgate_NK = unpermute_backward(dy_ND, y_MD, row_NK, gate_NK)
    return dy_MD, None, dgate_NK


gather_sum_rows.register_autograd(_gather_backward, setup_context=_gather_setup_context)


def permute(
    x_ND: torch.Tensor, expert_NK: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens in expert-sorted order: (x_MD, counts_E int32, row_NK int32), M = N * K.

    Rows of expert e are x_MD[start_e : start_e + counts_E[e]] with start_e the sum of earlier counts
    (`counts_E.cumsum(0, dtype=torch.int32)` are the offsets `grouped_mm` takes); within an expert, tokens
    keep their order. row_NK[n, k] is the row that holds token n for its k-th expert. Expert ids must lie
    in 0..num_experts-1 (the router's output does). The Triton kernels where they can run, else
    `permute_reference`. Gradients flow to x.
    """
    _check_routing(x_ND, expert_NK, num_experts)
    fits = x_ND.dtype in KERNEL_DTYPES and x_ND.shape[0] > 0 and num_experts <= MAX_EXPERTS
    if triton_runs_on(x_ND, expert_NK) and fits:
        row_NK, counts_E = sort_by_expert(expert_NK, num_experts)
        return scatter_rows(x_ND, row_NK, None), counts_E, row_NK
    return permute_reference(x_ND, expert_NK, num_experts)


def unpermute(y_MD: torch.Tensor, row_NK: torch.Tensor, gate_NK: torch.Tensor) -> torch.Tensor:
    """Expert outputs back in token order, weighted and summed over each token's K experts: y_ND.

    Takes the row_NK that `permute` returned. The Triton kernels where they can run, else
    `unpermute_reference`. Gradients flow to y_MD and to the gates.
    """
    _check_unpermute(y_MD, row_NK, gate_NK)
    if triton_runs_on(y_MD, row_NK, gate_NK) and y_MD.dtype in KERNEL_DTYPES and row_NK.shape[0] > 0:
        return gather_sum_rows(y_MD, row_NK, gate_NK)
    return unpermute_reference(y_MD, row_NK, gate_NK)
