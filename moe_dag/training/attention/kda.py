"""Kimi delta attention (KDA, Kimi Linear, arXiv:2510.26692): a gated delta rule with a forget gate
per channel, in its chunked form for training and its recurrent form as the reference.

Per head, with state S_t of shape [C_k, C_v], L2-normalised q_t and k_t, log decay g_t <= 0 (one per
key channel) and write strength beta_t in (0, 1):

    S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T,      o_t = S_t^T q_t

Chunked form (the WY representation of DeltaNet, arXiv:2406.06484, with per-channel decay as in
Gated DeltaNet and KDA). Within a chunk starting from state S_0, let G_i be the cumulative log decay
up to position i and Gamma_i = exp(G_i). Writing S_i = Diag(Gamma_i) S_0 + sum_{j<=i}
Diag(Gamma_i / Gamma_j) k_j u_j^T, the pseudo-values u solve a unit lower-triangular system

    (I + Diag(beta) A) U = Diag(beta) (V - (K * Gamma) S_0),   A_ij = sum_c k_ic k_jc exp(G_ic - G_jc), j < i

so U = T Diag(beta) V - T Diag(beta) (K * Gamma) S_0 with T = (I + Diag(beta) A)^-1, and

    O = (Q * Gamma) S_0 + (Aqk masked to j <= i) U,     Aqk_ij = sum_c q_ic k_jc exp(G_ic - G_jc)
    S_next = Diag(Gamma_last) S_0 + (K * exp(G_last - G))^T U

Every exponent is a difference G_i - G_j with j <= i, never positive, so nothing overflows. All chunks'
intra-chunk terms are computed at once; only the state is carried from chunk to chunk.

On CUDA with flash-linear-attention installed (the `gpu` extra), its fused `chunk_kda` kernel runs
instead; CPU never needs it.

The layer around the rule: q, k, v projections with a causal depthwise short convolution and SiLU;
forget gate g = -exp(A_log) softplus(W_up W_down x + dt_bias) (low rank, per channel); beta =
sigmoid(W_beta x) per head; output RMSNorm per head, gated by sigmoid(W_up' W_down' x); no rotary
positions (order enters through the recurrence and the convolution).

Shape legend: B batch, S sequence, D model width, H heads, C channels per head, K chunks, L chunk
length, R gate rank, W convolution width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.attention.registry import AttentionSpec, register
from moe_dag.training.attention.rotary import Rotary
from moe_dag.training.config import ModelConfig


def kda_recurrent(
    q_BHSC: torch.Tensor,
    k_BHSC: torch.Tensor,
    v_BHSC: torch.Tensor,
    g_BHSC: torch.Tensor,
    beta_BHS: torch.Tensor,
) -> torch.Tensor:
    """The rule token by token: the reference."""
    B, H, S, C = q_BHSC.shape
    state_BHCV = q_BHSC.new_zeros(B, H, C, v_BHSC.shape[-1])
    outputs = []
    for t in range(S):
        state_BHCV = state_BHCV * g_BHSC[:, :, t, :, None].exp()
        k_BHC, v_BHV = k_BHSC[:, :, t], v_BHSC[:, :, t]
        predicted_BHV = torch.einsum("bhc,bhcv->bhv", k_BHC, state_BHCV)
        delta_BHV = beta_BHS[:, :, t, None] * (v_BHV - predicted_BHV)
        state_BHCV = state_BHCV + k_BHC[..., None] * delta_BHV[..., None, :]
        outputs.append(torch.einsum("bhc,bhcv->bhv", q_BHSC[:, :, t], state_BHCV))
    return torch.stack(outputs, dim=2)


def kda_chunked(
    q_BHSC: torch.Tensor,
    k_BHSC: torch.Tensor,
    v_BHSC: torch.Tensor,
    g_BHSC: torch.Tensor,
    beta_BHS: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """The same outputs as `kda_recurrent`, chunk by chunk (see the module docstring)."""
    B, H, S, C = q_BHSC.shape
    pad = -S % chunk
    if pad:  # trailing padding with no decay and no write changes nothing before it
        q_BHSC, k_BHSC, v_BHSC, g_BHSC = (F.pad(t, (0, 0, 0, pad)) for t in (q_BHSC, k_BHSC, v_BHSC, g_BHSC))
        beta_BHS = F.pad(beta_BHS, (0, pad))
    K, L = (S + pad) // chunk, chunk
    q, k, v, g = (t.reshape(B, H, K, L, t.shape[-1]) for t in (q_BHSC, k_BHSC, v_BHSC, g_BHSC))
    beta_BHKL = beta_BHS.reshape(B, H, K, L)
    G_BHKLC = g.cumsum(dim=3)
    # exp(G_i - G_j) for j <= i (else 0): [B, H, K, L_i, L_j, C]
    decay_ij = G_BHKLC[:, :, :, :, None, :] - G_BHKLC[:, :, :, None, :, :]
    lower_LL = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    decay_ij = decay_ij.masked_fill(~lower_LL[..., None], float("-inf")).exp()
    A_kk = torch.einsum("bhkic,bhkjc,bhkijc->bhkij", k, k, decay_ij).tril(-1)
    A_qk = torch.einsum("bhkic,bhkjc,bhkijc->bhkij", q, k, decay_ij)
    eye_LL = torch.eye(L, device=q.device, dtype=q.dtype)
    system = eye_LL + beta_BHKL[..., None] * A_kk
    rhs = torch.cat((v, k * G_BHKLC.exp()), dim=-1) * beta_BHKL[..., None]
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_tilde_BHKLV, w_BHKLC = solved.split((v.shape[-1], C), dim=-1)
    q_decayed = q * G_BHKLC.exp()
    k_to_end = k * (G_BHKLC[:, :, :, -1:] - G_BHKLC).exp()
    state_BHCV = q.new_zeros(B, H, C, v.shape[-1])
    outputs = []
    for i in range(K):
        u_BHLV = u_tilde_BHKLV[:, :, i] - w_BHKLC[:, :, i] @ state_BHCV
        outputs.append(q_decayed[:, :, i] @ state_BHCV + A_qk[:, :, i] @ u_BHLV)
        state_BHCV = (
            G_BHKLC[:, :, i, -1, :, None].exp() * state_BHCV + k_to_end[:, :, i].transpose(-2, -1) @ u_BHLV
        )
    return torch.cat(outputs, dim=2)[:, :, :S]


def _fla_chunk_kda():
    """flash-linear-attention's fused kernel, when installed (CUDA only)."""
    try:
        from fla.ops.kda import chunk_kda
    except ImportError:
        return None
    return chunk_kda


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D, H, C = config.d_model, config.n_heads, config.head_dim
        R = config.kda.gate_rank or C
        self.n_heads, self.head_dim, self.chunk = H, C, config.kda.chunk_size
        self.wq = nn.Linear(D, H * C, bias=False)
        self.wk = nn.Linear(D, H * C, bias=False)
        self.wv = nn.Linear(D, H * C, bias=False)
        self.conv_weight_3XW = nn.Parameter(torch.empty(3, H * C, config.kda.conv_size))
        self.forget_down = nn.Linear(D, R, bias=False)
        self.forget_up = nn.Linear(R, H * C, bias=False)
        self.A_log_H = nn.Parameter(torch.empty(H))
        self.dt_bias_X = nn.Parameter(torch.empty(H * C))
        self.wbeta = nn.Linear(D, H, bias=False)
        self.out_gate_down = nn.Linear(D, R, bias=False)
        self.out_gate_up = nn.Linear(R, H * C, bias=False)
        self.out_norm = nn.RMSNorm(C, eps=config.norm_eps)
        self.wo = nn.Linear(H * C, D, bias=False)

    @torch.no_grad()
    def init_weights(self, std: float, residual_std: float) -> None:
        for module in self.children():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=residual_std if module is self.wo else std)
        nn.init.ones_(self.out_norm.weight)
        # A short convolution that starts as the identity on the current token.
        self.conv_weight_3XW.zero_()[..., -1] = 1.0
        # Decay rates A in [1, 16] and step sizes softplus(dt_bias) log-uniform in [1e-3, 1e-1], as
        # Mamba2 and Kimi Linear initialise them: per-step decays from about 0.999 to 0.2.
        self.A_log_H.copy_(torch.empty_like(self.A_log_H).uniform_(1, 16).log())
        dt = torch.exp(torch.empty_like(self.dt_bias_X).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias_X.copy_(dt + torch.log(-torch.expm1(-dt)))  # the inverse of softplus

    def _inputs(self, x_BSD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, S, _ = x_BSD.shape
        H, C = self.n_heads, self.head_dim
        qkv_3BXS = torch.stack((self.wq(x_BSD), self.wk(x_BSD), self.wv(x_BSD))).transpose(-2, -1)
        W = self.conv_weight_3XW.shape[-1]
        # Depthwise causal convolution: left padding, so position t sees t - W + 1 .. t only.
        padded = F.pad(qkv_3BXS, (W - 1, 0))
        conv = sum(padded[..., i : i + S] * self.conv_weight_3XW[:, None, :, i, None] for i in range(W))
        q, k, v = (F.silu(t).transpose(-2, -1).view(B, S, H, C).transpose(1, 2) for t in conv)
        q = F.normalize(q, dim=-1) / math.sqrt(C)
        k = F.normalize(k, dim=-1)
        # The rule runs in fp32 at least: decays and the triangular solve lose too much in bf16.
        rule = torch.promote_types(x_BSD.dtype, torch.float32)
        forget = self.forget_up(self.forget_down(x_BSD)) + self.dt_bias_X
        g_BSX = -self.A_log_H.to(rule).exp().repeat_interleave(C) * F.softplus(forget.to(rule))
        g_BHSC = g_BSX.view(B, S, H, C).transpose(1, 2)
        beta_BHS = torch.sigmoid(self.wbeta(x_BSD).to(rule)).transpose(1, 2)
        return q.to(rule), k.to(rule), v.to(rule), g_BHSC, beta_BHS

    def _output(self, o_BHSC: torch.Tensor, x_BSD: torch.Tensor) -> torch.Tensor:
        B, S, _ = x_BSD.shape
        o_BSHC = self.out_norm(o_BHSC.transpose(1, 2).to(x_BSD.dtype))
        gate_BSHC = torch.sigmoid(self.out_gate_up(self.out_gate_down(x_BSD))).view_as(o_BSHC)
        return self.wo((o_BSHC * gate_BSHC).reshape(B, S, -1))

    def forward(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        q, k, v, g, beta = self._inputs(x_BSD)
        fused = _fla_chunk_kda() if x_BSD.is_cuda else None
        if fused is not None:
            o_BSHC, _ = fused(
                *(t.transpose(1, 2).contiguous() for t in (q, k, v, g)),
                beta.transpose(1, 2).contiguous(),
                scale=1.0,
            )
            return self._output(o_BSHC.transpose(1, 2), x_BSD)
        with torch.autocast(x_BSD.device.type, enabled=False):
            o_BHSC = kda_chunked(q, k, v, g, beta, self.chunk)
        return self._output(o_BHSC, x_BSD)

    def reference(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        q, k, v, g, beta = self._inputs(x_BSD)
        return self._output(kda_recurrent(q, k, v, g, beta), x_BSD)


def _parameters(config: ModelConfig) -> int:
    D, H, C = config.d_model, config.n_heads, config.head_dim
    R = config.kda.gate_rank or C
    projections = 4 * D * H * C + 3 * H * C * config.kda.conv_size
    gates = 2 * (D * R + R * H * C) + H + H * C + D * H
    return projections + gates + C


def _mixing_flops(config: ModelConfig, seq_len: int) -> float:
    # Per token and head: decay, k^T S, the rank-1 write and q^T S, each about 2 C^2 FLOPs.
    return 8 * config.n_heads * config.head_dim**2


register(
    "kda",
    AttentionSpec(
        build=KimiDeltaAttention,
        num_parameters=_parameters,
        mixing_flops=_mixing_flops,
        rotary_dim=lambda c: 0,
    ),
)
