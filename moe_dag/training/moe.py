"""The mixture-of-experts feed-forward layer: router, routed experts, shared experts, output norm.

Token-choice top-k routing with auxiliary-loss-free load balancing (DeepSeek-V3, arXiv:2412.19437,
sec. 2.1.2): a per-expert bias, never trained by gradients, is added to the router scores when choosing
experts but not when weighting their outputs. The layer only counts the tokens each expert received;
the bias update that uses those counts runs outside the model (`load_balance.ExpertBiasUpdater`, an
optimizer pre-step hook), so data-parallel code can all-reduce the counts first.

Optional, off by default: the sequence-wise balance loss and the router z-loss (their sum is left in
`MoE.router_loss` after each training forward, for the trainer to add to the loss), and a capacity
limit per expert (dropped (token, expert) pairs are counted; the default is dropless). Router math
runs in fp32 whatever the precision recipe.

The memory-bound steps run through the kernels room's dispatchers (Triton on a GPU, their plain-PyTorch
references elsewhere): `route` scores, picks and counts; `permute` sorts the (token, expert) pairs by
expert; `unpermute` brings the gated outputs home and sums them per token; `grouped_mm` (through
`grouped_mm.py`) runs every expert on its rows.

Seams for expert parallelism and precision recipes:
- `MoE.dispatch(experts, x_ND, expert_NK, gate_NK)` is all expert computation, by default
  `LocalDispatch`: sort the pairs by expert, call the experts, unsort. Expert parallelism
  (`expert_parallel.py`) puts an all-to-all around the experts' call instead. A pair whose expert is
  E (== num_experts) was dropped by the capacity limit and goes nowhere.
- `RoutedExperts(x_MD, counts_E)` takes expert-sorted rows and per-expert counts and returns the
  experts' outputs in the same order, through `RoutedExperts.grouped_mm` (see `grouped_mm.py`), which
  precision recipes replace (the Transformer Engine recipe replaces the whole module).

Shape legend: B batch, S sequence, N tokens (B * S), D model width, E routed experts, K experts chosen
per token, M routed (token, expert) rows, F expert hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.kernels import permute, rms_norm, route, unpermute
from moe_dag.training.config import ModelConfig
from moe_dag.training.grouped_mm import grouped_mm
from moe_dag.training.slice_init import normal_rows_

GroupedMatmul = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# (experts, x_ND, expert_NK, gate_NK) -> y_ND: the routed pairs to the experts and their gated sum back.
ExpertDispatch = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# What `MoE.router_stats` sums over training forwards (read and zeroed by `health.RouterHealth`).
ROUTER_STATS = ("entropy_sum", "tokens", "dropped_pairs", "nonfinite_tokens")


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x) (arXiv:2002.05202): the dense FFN and the shared experts."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _SwiGLUFromFused(torch.autograd.Function):
    """silu(h1) * h3 where h1 and h3 are the two halves of one [M, 2F] product, with the gradient
    written straight into one [M, 2F] tensor: autograd of `chunk` builds it with an extra cat of both
    halves' gradients (0.5 ms of a 30 ms layer step at demo sizes on one CPU thread). The same
    operations as autograd of the plain expression otherwise, so the results are bitwise the same."""

    @staticmethod
    def forward(ctx, h13_M2F: torch.Tensor) -> torch.Tensor:
        h1_MF, h3_MF = h13_M2F.chunk(2, dim=-1)
        silu_MF = F.silu(h1_MF)
        ctx.save_for_backward(h13_M2F, silu_MF)
        return silu_MF * h3_MF

    @staticmethod
    def backward(ctx, dout_MF: torch.Tensor) -> torch.Tensor:
        h13_M2F, silu_MF = ctx.saved_tensors
        h1_MF, h3_MF = h13_M2F.chunk(2, dim=-1)
        dh13_M2F = torch.empty_like(h13_M2F)
        dh1_MF, dh3_MF = dh13_M2F.chunk(2, dim=-1)
        torch.mul(dout_MF, silu_MF, out=dh3_MF)
        torch.mul(dout_MF, h3_MF, out=dh1_MF)  # the gradient reaching silu(h1), in its gradient's place
        torch.ops.aten.silu_backward.grad_input(dh1_MF, h1_MF, grad_input=dh1_MF)
        return dh13_M2F


def swiglu_fused(h13_M2F: torch.Tensor) -> torch.Tensor:
    """silu(h1) * h3 for h13 = [h1 | h3] along the last dimension (w1 and w3 computed as one product)."""
    return _SwiGLUFromFused.apply(h13_M2F)


@dataclass(frozen=True, slots=True)
class RouterOutput:
    expert_NK: torch.Tensor  # chosen experts, best first
    gate_NK: torch.Tensor  # fp32 weights of the chosen experts, summing to 1 per token
    counts_E: torch.Tensor  # int32 (token, expert) pairs per expert
    logits_NE: torch.Tensor  # fp32
    affinity_NE: torch.Tensor  # fp32 scores normalised to sum to 1 per token


class Router(nn.Module):
    """Scores every expert per token and picks the top k.

    Scores are sigmoid(logits) (DeepSeek-V3) or softmax(logits). The choice uses score + expert_bias_E;
    the gate weights use the scores alone, renormalised to sum to 1 over the k chosen experts. One
    `route` call does scores, choice, gates and counts; the normalised affinities (for the balance loss
    and the router entropy) are computed beside it.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.score = config.top_k, config.router_score
        self.gate = nn.Linear(config.d_model, config.num_experts, bias=False)
        # A buffer, not a parameter: gradients never touch it, only ExpertBiasUpdater does.
        self.register_buffer("expert_bias_E", torch.zeros(config.num_experts, dtype=torch.float32))

    def forward(self, x_ND: torch.Tensor) -> RouterOutput:
        with torch.autocast(x_ND.device.type, enabled=False):
            logits_NE = F.linear(x_ND.float(), self.gate.weight.float())
            expert_NK, gate_NK, counts_E = route(logits_NE, self.expert_bias_E, self.top_k, self.score)
            if self.score == "sigmoid":
                scores_NE = torch.sigmoid(logits_NE)
                affinity_NE = scores_NE / scores_NE.sum(dim=-1, keepdim=True)
            else:
                affinity_NE = logits_NE.softmax(dim=-1)
        return RouterOutput(
            expert_NK=expert_NK,
            gate_NK=gate_NK,
            counts_E=counts_E,
            logits_NE=logits_NE,
            affinity_NE=affinity_NE,
        )


def sequence_balance_loss(affinity_BSE: torch.Tensor, expert_BSK: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss without its alpha (arXiv:2412.19437 eq. 17-20):
    mean over sequences of sum_i f_i P_i, where f_i = E / (K S) x (tokens of the sequence routed to
    expert i) and P_i = the mean normalised affinity of the sequence for expert i. 1 when balanced."""
    B, S, E = affinity_BSE.shape
    K = expert_BSK.shape[-1]
    counts_BE = torch.zeros(B, E + 1, device=affinity_BSE.device).scatter_add_(
        1, expert_BSK.reshape(B, -1), torch.ones(B, S * K, device=affinity_BSE.device)
    )[:, :E]  # column E collects pairs dropped by the capacity limit
    fraction_BE = counts_BE * (E / (K * S))
    return (fraction_BE * affinity_BSE.mean(dim=1)).sum(dim=-1).mean()


def router_z_loss(logits_NE: torch.Tensor) -> torch.Tensor:
    """ST-MoE's z-loss without its coefficient (arXiv:2202.08906 eq. 5): mean of logsumexp(logits)^2."""
    return torch.logsumexp(logits_NE, dim=-1).square().mean()


def drop_over_capacity(expert_NK: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """`expert_NK` with the pairs past each expert's first `capacity` (in token order) set to E."""
    flat_M = expert_NK.flatten()
    order_M = flat_M.argsort(stable=True)
    counts_E = torch.bincount(flat_M, minlength=num_experts)
    starts_E = torch.cumsum(counts_E, dim=0) - counts_E
    sorted_M = flat_M[order_M]
    rank_M = torch.empty_like(flat_M)
    rank_M[order_M] = torch.arange(flat_M.numel(), device=flat_M.device) - starts_E[sorted_M]
    return torch.where(rank_M < capacity, flat_M, num_experts).view_as(expert_NK)


@dataclass(frozen=True, slots=True)
class SortedPairs:
    x_MD: torch.Tensor  # the kept pairs' token rows grouped by expert, in token order within an expert
    counts_E: torch.Tensor  # int32 rows per expert
    row_NK: torch.Tensor  # int32 row of each pair in sorted order; dropped pairs' rows lie past the kept


def sort_pairs(
    x_ND: torch.Tensor, expert_NK: torch.Tensor, num_experts: int, drops_pairs: bool
) -> SortedPairs:
    """`permute`, with the pairs a capacity limit dropped (expert == num_experts) sorted last, cut off."""
    if not drops_pairs:
        return SortedPairs(*permute(x_ND, expert_NK, num_experts))
    x_MD, counts_E, row_NK = permute(x_ND, expert_NK, num_experts + 1)
    kept = x_MD.shape[0] - int(counts_E[num_experts])  # a host sync, paid only under a capacity limit
    return SortedPairs(x_MD[:kept], counts_E[:num_experts], row_NK)


def unsort_pairs(y_MD: torch.Tensor, pairs: SortedPairs, gate_NK: torch.Tensor) -> torch.Tensor:
    """Each token's gated expert outputs summed: out[n] = sum over k of gate[n, k] * y[row of (n, k)]."""
    dropped = pairs.row_NK.numel() - y_MD.shape[0]
    if dropped:  # dropped pairs contribute zero rows
        y_MD = torch.cat((y_MD, y_MD.new_zeros(dropped, y_MD.shape[1])))
    return unpermute(y_MD, pairs.row_NK, gate_NK)


class LocalDispatch:
    """The routed pairs to this process's experts and back: sort by expert, compute, unsort."""

    def __init__(self, num_experts: int, drops_pairs: bool) -> None:
        self.num_experts, self.drops_pairs = num_experts, drops_pairs

    def __call__(
        self, experts: nn.Module, x_ND: torch.Tensor, expert_NK: torch.Tensor, gate_NK: torch.Tensor
    ) -> torch.Tensor:
        pairs = sort_pairs(x_ND, expert_NK, self.num_experts, self.drops_pairs)
        return unsort_pairs(experts(pairs.x_MD, pairs.counts_E), pairs, gate_NK)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class RoutedExperts(nn.Module):
    """E SwiGLU experts stored as stacked [E, ...] weights, so expert parallelism can shard dim 0.

    `keep(first, count)` narrows the module to experts [first, first + count) of the E (expert
    parallelism's local slice); `init_weights` then draws only those, with the values a whole stack
    drawn from the same generator state holds there (`slice_init.py`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        E, F_, D = config.num_experts, config.expert_hidden, config.d_model
        self.w1_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.w3_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.w2_EDF = nn.Parameter(torch.empty(E, D, F_))
        self.grouped_mm: GroupedMatmul = grouped_mm
        self.first_expert, self.total_experts = 0, E

    def keep(self, first: int, count: int) -> None:
        """Hold experts [first, first + count) of the whole stack only (on the meta device: no memory
        yet, `init_weights` draws them later; on a built model: their current values)."""
        if self.first_expert != 0 or self.w1_EFD.shape[0] != self.total_experts:
            raise ValueError("the experts are already narrowed to a slice")
        for name, weight in list(self.named_parameters(recurse=False)):
            setattr(self, name, nn.Parameter(weight.detach()[first : first + count].clone()))
        self.first_expert = first

    def init_weights(self, std: float) -> None:
        """normal(0, std) for w1, w3 and w2, in that order, as if drawn for the whole stack."""
        for weight in (self.w1_EFD, self.w3_EFD, self.w2_EDF):
            normal_rows_(weight, std, first_row=self.first_expert, total_rows=self.total_experts)

    def forward(self, x_MD: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """The experts applied to expert-sorted rows: counts_E[e] consecutive rows go to expert e."""
        dtype = _compute_dtype(x_MD)
        # One grouped product for w1 and w3 together: half the calls, the same FLOPs.
        w13_E2FD = torch.cat((self.w1_EFD, self.w3_EFD), dim=1).to(dtype)
        h_MF = swiglu_fused(self.grouped_mm(x_MD.to(dtype), w13_E2FD, counts_E))
        return self.grouped_mm(h_MF, self.w2_EDF.to(dtype), counts_E)


class MoE(nn.Module):
    """Routed experts plus always-on shared experts, then the experts' pre-output norm.

    Pre-output norm: the summed expert output goes through a weightless RMSNorm and is multiplied by
    `output_norm_scale`, one learnable scalar initialised at `output_norm_scale_init` (2.0), before the
    block adds it to the residual stream. The size of each MoE layer's contribution is then set by that
    one scalar, whatever the router and the expert weights do.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm_eps, self.num_experts, self.top_k = config.norm_eps, config.num_experts, config.top_k
        self.capacity_factor = config.capacity_factor
        self.aux_loss_alpha, self.z_loss_coef = config.router_aux_loss_alpha, config.router_z_loss_coef
        self.router = Router(config)
        self.experts = RoutedExperts(config)
        # A plain attribute, not a module: expert parallelism swaps it without touching the state dict.
        self.dispatch: ExpertDispatch = LocalDispatch(config.num_experts, config.capacity_factor is not None)
        # n shared experts of width F equal one SwiGLU of width n * F: same function, fewer matmuls.
        self.shared = (
            SwiGLU(config.d_model, config.expert_hidden * config.num_shared_experts)
            if config.num_shared_experts
            else None
        )
        # A 1-element vector rather than a 0-d tensor: FSDP2 shards no 0-d parameter.
        self.output_norm_scale = nn.Parameter(torch.empty(1))
        # Counted in training forwards only, summed over micro-batches, zeroed by ExpertBiasUpdater.
        self.register_buffer(
            "tokens_per_expert_E", torch.zeros(config.num_experts, dtype=torch.float32), persistent=False
        )
        self.register_buffer("router_stats", torch.zeros(len(ROUTER_STATS)), persistent=False)
        self.router_loss: torch.Tensor | None = None

    def capacity(self, num_tokens: int) -> int | None:
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        B, S, D = x_BSD.shape
        x_ND = x_BSD.reshape(-1, D)
        routed = self.router(x_ND)
        expert_NK = routed.expert_NK
        capacity = self.capacity(x_ND.shape[0])
        if capacity is not None:
            expert_NK = drop_over_capacity(expert_NK, self.num_experts, capacity)
        if self.training:
            self._count(routed, expert_NK)
            self.router_loss = self._router_loss(routed, expert_NK.view(B, S, self.top_k))
        y_ND = self.dispatch(self.experts, x_ND, expert_NK, routed.gate_NK)
        if self.shared is not None:  # in place, no new [N, D]: no backward saves the dispatch's output
            y_ND = y_ND.add_(self.shared(x_ND))
        y_ND = rms_norm(y_ND, self.output_norm_scale, eps=self.norm_eps)
        return y_ND.view_as(x_BSD)

    def _router_loss(self, routed: RouterOutput, expert_BSK: torch.Tensor) -> torch.Tensor | None:
        losses = []
        if self.aux_loss_alpha:
            affinity_BSE = routed.affinity_NE.view(*expert_BSK.shape[:2], -1)
            losses.append(self.aux_loss_alpha * sequence_balance_loss(affinity_BSE, expert_BSK))
        if self.z_loss_coef:
            losses.append(self.z_loss_coef * router_z_loss(routed.logits_NE))
        return sum(losses) if losses else None

    @torch.no_grad()
    def _count(self, routed: RouterOutput, expert_NK: torch.Tensor) -> None:
        E = self.num_experts
        if self.capacity_factor is None:  # nothing dropped: the router already counted
            load_E = routed.counts_E.float()
            dropped = load_E.new_zeros(())
        else:
            counts = torch.bincount(expert_NK.flatten(), minlength=E + 1).float()
            load_E, dropped = counts[:E], counts[E]
        self.tokens_per_expert_E += load_E
        p_NE = routed.affinity_NE
        # entr: -p log p in one pass (0 at p = 0); nansum skips tokens with non-finite logits, counted below
        entropy = torch.special.entr(p_NE).sum(dim=-1).nansum()
        nonfinite = (~torch.isfinite(routed.logits_NE)).any(dim=-1).sum()
        self.router_stats += torch.stack(
            (entropy, load_E.new_tensor(p_NE.shape[0]), dropped, nonfinite.float())
        )
