"""The mixture-of-experts feed-forward layer: router, routed experts, shared experts, output norm.

Token-choice top-k routing with auxiliary-loss-free load balancing (DeepSeek-V3, arXiv:2412.19437,
sec. 2.1.2): a per-expert bias, never trained by gradients, is added to the router scores when choosing
experts but not when weighting their outputs. The layer only counts the tokens each expert received;
the bias update that uses those counts runs outside the model (`load_balance.ExpertBiasUpdater`, an
optimizer pre-step hook), so data-parallel code can all-reduce the counts first.

All expert computation goes through `RoutedExperts.forward(x_ND, expert_NK, gate_NK)`. The version here
loops over the local experts; an expert-parallel version (all-to-all dispatch) replaces that one method.

Shape legend: B batch, S sequence, N tokens (B * S), D model width, E routed experts, K experts chosen
per token, M routed (token, expert) pairs (N * K), C pairs routed to one expert, F expert hidden width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.config import ModelConfig


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x) (arXiv:2002.05202): the dense FFN and the shared experts."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Router(nn.Module):
    """Scores every expert per token and picks the top k.

    Scores are sigmoid(logits) (DeepSeek-V3) or softmax(logits). The choice uses score + expert_bias_E;
    the gate weights use the scores alone, renormalised to sum to 1 over the k chosen experts.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.score = config.top_k, config.router_score
        self.gate = nn.Linear(config.d_model, config.num_experts, bias=False)
        # A buffer, not a parameter: gradients never touch it, only ExpertBiasUpdater does.
        self.register_buffer("expert_bias_E", torch.zeros(config.num_experts, dtype=torch.float32))

    def forward(self, x_ND: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits_NE = self.gate(x_ND).float()
        scores_NE = torch.sigmoid(logits_NE) if self.score == "sigmoid" else logits_NE.softmax(dim=-1)
        expert_NK = torch.topk(scores_NE.detach() + self.expert_bias_E, self.top_k, dim=-1).indices
        gate_NK = scores_NE.gather(-1, expert_NK)
        gate_NK = gate_NK / gate_NK.sum(dim=-1, keepdim=True)
        return expert_NK, gate_NK.to(x_ND.dtype)


class RoutedExperts(nn.Module):
    """E SwiGLU experts stored as stacked [E, ...] weights, so expert parallelism can shard dim 0."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        E, F_, D = config.num_experts, config.expert_hidden, config.d_model
        self.w1_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.w3_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.w2_EDF = nn.Parameter(torch.empty(E, D, F_))

    def forward(self, x_ND: torch.Tensor, expert_NK: torch.Tensor, gate_NK: torch.Tensor) -> torch.Tensor:
        """Reference dispatch: sort the (token, expert) pairs by expert, apply each expert to its
        contiguous slice of tokens, then scatter-add the gated outputs back to their tokens."""
        K = expert_NK.shape[1]
        order_M = expert_NK.flatten().argsort(stable=True)
        token_M = order_M // K
        counts = torch.bincount(expert_NK.flatten(), minlength=self.w1_EFD.shape[0]).tolist()
        x_MD = x_ND.index_select(0, token_M)
        outputs = []
        for e, x_CD in enumerate(x_MD.split(counts)):
            h_CF = F.silu(x_CD @ self.w1_EFD[e].T) * (x_CD @ self.w3_EFD[e].T)
            outputs.append(h_CF @ self.w2_EDF[e].T)
        out_MD = torch.cat(outputs) * gate_NK.flatten()[order_M, None]
        return torch.zeros_like(x_ND).index_add_(0, token_M, out_MD)


class MoE(nn.Module):
    """Routed experts plus always-on shared experts, then the experts' pre-output norm.

    Pre-output norm: the summed expert output goes through a weightless RMSNorm and is multiplied by
    `output_norm_scale`, one learnable scalar initialised at `output_norm_scale_init` (2.0), before the
    block adds it to the residual stream. The size of each MoE layer's contribution is then set by that
    one scalar, whatever the router and the expert weights do.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm_eps = config.norm_eps
        self.router = Router(config)
        self.experts = RoutedExperts(config)
        # n shared experts of width F equal one SwiGLU of width n * F: same function, fewer matmuls.
        self.shared = (
            SwiGLU(config.d_model, config.expert_hidden * config.num_shared_experts)
            if config.num_shared_experts
            else None
        )
        self.output_norm_scale = nn.Parameter(torch.empty(()))
        # Counted in training forwards only, summed over micro-batches, zeroed by ExpertBiasUpdater.
        self.register_buffer(
            "tokens_per_expert_E", torch.zeros(config.num_experts, dtype=torch.float32), persistent=False
        )

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        x_ND = x_BSD.reshape(-1, x_BSD.shape[-1])
        expert_NK, gate_NK = self.router(x_ND)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert_E += torch.bincount(
                    expert_NK.flatten(), minlength=self.tokens_per_expert_E.numel()
                )
        y_ND = self.experts(x_ND, expert_NK, gate_NK)
        if self.shared is not None:
            y_ND = y_ND + self.shared(x_ND)
        y_ND = self.output_norm_scale * F.rms_norm(y_ND, (y_ND.shape[-1],), eps=self.norm_eps)
        return y_ND.view_as(x_BSD)
