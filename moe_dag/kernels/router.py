"""Token-choice top-k routing in one pass: a Triton kernel beside the plain-PyTorch reference it must match.

For each token the router turns its logits into scores (sigmoid as in DeepSeek-V3, or softmax), picks the
k experts with the highest score + bias, and weights them by their scores renormalised to sum to 1 over
the k chosen. The bias is the auxiliary-loss-free balancing term (arXiv:2412.19437, sec. 2.1.2): it moves
which experts are chosen, never how much their outputs weigh, and no gradient reaches it. The kernel
also counts the tokens each expert received, which the bias update and the dispatch both need.

Gradients (for the k chosen experts; the others get none). With g = the renormalised gates, dg their
incoming gradient and c = sum_k dg_k g_k:

    softmax:  dlogit_k = g_k (dg_k - c)               (softmax renormalised over the chosen = softmax of
                                                       their logits alone: the full denominator cancels)
    sigmoid:  dlogit_k = g_k (1 - s_k) (dg_k - c)     (s_k = sigmoid(logit_k); d s / d logit = s (1 - s))

The forward kernel holds a block of token rows with all E logits in registers and takes the top k by k
rounds of argmax (ties go to the lower expert index), so E is capped at MAX_EXPERTS. Counts are a
histogram per block added atomically: integer adds, so the result does not depend on their order.

Shape legend: N tokens, E experts, K experts chosen per token (top_k).
"""

from __future__ import annotations

from typing import Literal

import torch
import triton
import triton.language as tl

from moe_dag.kernels.backend import triton_runs_on

ScoreFunction = Literal["sigmoid", "softmax"]
SCORE_FUNCTIONS = ("sigmoid", "softmax")
# A block of rows x all experts stays in registers; DeepSeek-V3 routes over 256, so 1024 leaves room.
MAX_EXPERTS = 1024
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_inputs(logits_NE: torch.Tensor, bias_E: torch.Tensor, top_k: int, score_fn: str) -> None:
    if logits_NE.dim() != 2:
        raise ValueError(f"route needs logits of shape (N, E), got {tuple(logits_NE.shape)}")
    E = logits_NE.shape[1]
    if bias_E.shape != (E,):
        raise ValueError(f"route needs a bias of shape ({E},) for {E} experts, got {tuple(bias_E.shape)}")
    if not 0 < top_k <= E:
        raise ValueError(f"route needs top_k in 1..{E} (the number of experts), got {top_k}")
    if score_fn not in SCORE_FUNCTIONS:
        raise ValueError(f"route's score_fn must be one of {SCORE_FUNCTIONS}, got {score_fn!r}")


def route_reference(
    logits_NE: torch.Tensor, bias_E: torch.Tensor, top_k: int, score_fn: ScoreFunction
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain PyTorch: (expert_NK int64, gate_NK in float32 or float64, counts_E int32), experts in
    descending order of score + bias, as torch.topk returns them."""
    _check_inputs(logits_NE, bias_E, top_k, score_fn)
    logits_NE = logits_NE.to(torch.promote_types(logits_NE.dtype, torch.float32))
    scores_NE = torch.sigmoid(logits_NE) if score_fn == "sigmoid" else logits_NE.softmax(dim=-1)
    expert_NK = torch.topk(scores_NE.detach() + bias_E, top_k, dim=-1).indices
    gate_NK = scores_NE.gather(-1, expert_NK)
    gate_NK = gate_NK / gate_NK.sum(dim=-1, keepdim=True)
    counts_E = torch.bincount(expert_NK.flatten(), minlength=logits_NE.shape[1]).to(torch.int32)
    return expert_NK, gate_NK, counts_E


@triton.jit
def _route_forward_kernel(
    logits_ptr, bias_ptr, expert_ptr, gate_ptr, counts_ptr, N, E,
    K: tl.constexpr, SIGMOID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    experts = tl.arange(0, BLOCK_E)
    chosen = tl.arange(0, BLOCK_K)
    in_rows, in_experts = rows < N, experts < E
    logits = tl.load(
        logits_ptr + rows[:, None] * E + experts[None, :],
        mask=in_rows[:, None] & in_experts[None, :],
        other=0.0,
    ).to(tl.float32)
    logits = tl.where(in_experts[None, :], logits, float("-inf"))
    if SIGMOID:
        scores = tl.sigmoid(logits)
    else:
        exp = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        scores = exp / tl.sum(exp, axis=1)[:, None]
    bias = tl.load(bias_ptr + experts, mask=in_experts, other=0.0).to(tl.float32)
    candidates = tl.where(in_experts[None, :], scores + bias[None, :], float("-inf"))

    expert_NK = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.int64)
    gate_NK = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for k in tl.static_range(K):
        best = tl.argmax(candidates, axis=1)
        is_best = experts[None, :] == best[:, None]
        score = tl.sum(tl.where(is_best, scores, 0.0), axis=1)
        expert_NK = tl.where(chosen[None, :] == k, best[:, None].to(tl.int64), expert_NK)
        gate_NK = tl.where(chosen[None, :] == k, score[:, None], gate_NK)
        counts += tl.histogram(best, BLOCK_E, mask=in_rows)
        candidates = tl.where(is_best, float("-inf"), candidates)
    gate_NK = gate_NK / tl.sum(gate_NK, axis=1)[:, None]

    out = rows[:, None] * K + chosen[None, :]
    in_out = in_rows[:, None] & (chosen[None, :] < K)
    tl.store(expert_ptr + out, expert_NK, mask=in_out)
    tl.store(gate_ptr + out, gate_NK, mask=in_out)
    tl.atomic_add(counts_ptr + experts, counts, mask=in_experts)


@triton.jit
def _route_backward_kernel(
    dgate_ptr, gate_ptr, expert_ptr, logits_ptr, dlogits_ptr, N, E,
    K: tl.constexpr, SIGMOID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    experts = tl.arange(0, BLOCK_E)
    chosen = tl.arange(0, BLOCK_K)
    in_rows = rows < N
    in_chosen = in_rows[:, None] & (chosen[None, :] < K)
    at_NK = rows[:, None] * K + chosen[None, :]
    dgate = tl.load(dgate_ptr + at_NK, mask=in_chosen, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + at_NK, mask=in_chosen, other=0.0).to(tl.float32)
    expert = tl.load(expert_ptr + at_NK, mask=in_chosen, other=0)
    dlogit_NK = gate * (dgate - tl.sum(dgate * gate, axis=1)[:, None])
    if SIGMOID:
        logit = tl.load(logits_ptr + rows[:, None] * E + expert, mask=in_chosen, other=0.0).to(tl.float32)
        dlogit_NK *= 1.0 - tl.sigmoid(logit)

    dlogits = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float32)
    for k in tl.static_range(K):
        expert_k = tl.sum(tl.where(chosen[None, :] == k, expert, 0), axis=1)
        dlogit_k = tl.sum(tl.where(chosen[None, :] == k, dlogit_NK, 0.0), axis=1)
        dlogits = tl.where(experts[None, :] == expert_k[:, None], dlogit_k[:, None], dlogits)
    tl.store(
        dlogits_ptr + rows[:, None] * E + experts[None, :],
        dlogits.to(dlogits_ptr.dtype.element_ty),
        mask=in_rows[:, None] & (experts[None, :] < E),
    )


def _launch_config(E: int, top_k: int) -> dict[str, int]:
    """One block of rows per program, sized so a block of rows x all experts is ~4096 scores."""
    block_e = triton.next_power_of_2(E)
    return {
        "BLOCK_N": max(1, 4096 // block_e),
        "BLOCK_E": block_e,
        "BLOCK_K": triton.next_power_of_2(top_k),
        "num_warps": 4 if block_e <= 256 else 8,
    }


@torch.library.custom_op("moe_dag::route", mutates_args=())
def route_op(
    logits_NE: torch.Tensor, bias_E: torch.Tensor, top_k: int, score_fn: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernel: (gate_NK float32, expert_NK int64, counts_E int32).

    Gates come first, unlike in `route`, because torch.library.opcheck's compile check sums the outputs
    into the first one's dtype, which must then be a float.
    """
    _check_inputs(logits_NE, bias_E, top_k, score_fn)
    N, E = logits_NE.shape
    if E > MAX_EXPERTS:
        raise ValueError(f"the route kernel takes up to {MAX_EXPERTS} experts, got {E}")
    expert_NK = torch.empty(N, top_k, dtype=torch.int64, device=logits_NE.device)
    gate_NK = torch.empty(N, top_k, dtype=torch.float32, device=logits_NE.device)
    counts_E = torch.zeros(E, dtype=torch.int32, device=logits_NE.device)
    config = _launch_config(E, top_k)
    _route_forward_kernel[(triton.cdiv(N, config["BLOCK_N"]),)](
        logits_NE.contiguous(), bias_E.contiguous(), expert_NK, gate_NK, counts_E, N, E,
        K=top_k, SIGMOID=score_fn == "sigmoid", **config,
    )  # fmt: skip
    return gate_NK, expert_NK, counts_E


@route_op.register_fake
def _(
    logits_NE: torch.Tensor, bias_E: torch.Tensor, top_k: int, score_fn: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_inputs(logits_NE, bias_E, top_k, score_fn)
    N, E = logits_NE.shape
    return (
        logits_NE.new_empty(N, top_k, dtype=torch.float32),
        logits_NE.new_empty(N, top_k, dtype=torch.int64),
        logits_NE.new_empty(E, dtype=torch.int32),
    )


@torch.library.custom_op("moe_dag::route_backward", mutates_args=())
def route_backward_op(
    dgate_NK: torch.Tensor, gate_NK: torch.Tensor, expert_NK: torch.Tensor, logits_NE: torch.Tensor,
    score_fn: str,
) -> torch.Tensor:  # fmt: skip
    """dlogits_NE (shape and dtype of the logits): nonzero only at the chosen experts."""
    N, E = logits_NE.shape
    top_k = expert_NK.shape[1]
    dlogits_NE = torch.empty_like(logits_NE)
    config = _launch_config(E, top_k)
    _route_backward_kernel[(triton.cdiv(N, config["BLOCK_N"]),)](
        dgate_NK.contiguous(), gate_NK.contiguous(), expert_NK.contiguous(), logits_NE.contiguous(),
        dlogits_NE, N, E, K=top_k, SIGMOID=score_fn == "sigmoid", **config,
    )  # fmt: skip
    return dlogits_NE


@route_backward_op.register_fake
def _(
    dgate_NK: torch.Tensor, gate_NK: torch.Tensor, expert_NK: torch.Tensor, logits_NE: torch.Tensor,
    score_fn: str,
) -> torch.Tensor:  # fmt: skip
    return torch.empty_like(logits_NE)


def _setup_context(ctx, inputs, output) -> None:
    logits_NE, _bias_E, _top_k, score_fn = inputs
    gate_NK, expert_NK, counts_E = output
    ctx.mark_non_differentiable(expert_NK, counts_E)
    ctx.save_for_backward(logits_NE, expert_NK, gate_NK)
    ctx.score_fn = score_fn


def _backward(ctx, dgate_NK: torch.Tensor, _dexpert, _dcounts):
    logits_NE, expert_NK, gate_NK = ctx.saved_tensors
    dlogits_NE = route_backward_op(dgate_NK, gate_NK, expert_NK, logits_NE, ctx.score_fn)
    return dlogits_NE, None, None, None


route_op.register_autograd(_backward, setup_context=_setup_context)


def route(
    logits_NE: torch.Tensor, bias_E: torch.Tensor, top_k: int, score_fn: ScoreFunction
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k experts per token: (expert_NK int64, gate_NK float32, counts_E int32).

    The Triton kernel where it can run (CUDA tensors, or TRITON_INTERPRET=1), else `route_reference`.
    Gradients flow to the logits through the gates; the bias only chooses.
    """
    _check_inputs(logits_NE, bias_E, top_k, score_fn)
    N, E = logits_NE.shape
    if triton_runs_on(logits_NE, bias_E) and logits_NE.dtype in KERNEL_DTYPES and N > 0 and E <= MAX_EXPERTS:
        gate_NK, expert_NK, counts_E = route_op(logits_NE, bias_E, top_k, score_fn)
        return expert_NK, gate_NK, counts_E
    return route_reference(logits_NE, bias_E, top_k, score_fn)
