"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 sec. 2.1; DeepSeek-V3 sec. 2.1.1).

Keys and values are rebuilt from one compressed latent c_kv per token (kv_lora_rank wide, what an
inference cache stores); queries optionally from a latent c_q. Each head's query and key split into
a part without positions (nope) and a narrow decoupled rotary part (rope); the rotary key is one
per token, shared by all heads:

    c_kv = RMSNorm(W_dkv x)          k_h = [W_uk_h c_kv ; RoPE(W_kr x)]     v_h = W_uv_h c_kv
    c_q  = RMSNorm(W_dq x)           q_h = [W_uq_h c_q  ; RoPE(W_qr_h c_q)]

Training decompresses keys and values and runs causal SDPA. `reference` computes the same function
the way inference does, in the latent space ("weight absorption": q_h^T W_uk_h c_kv scores each latent
directly, and W_uv_h is applied after the weighted sum), with the softmax written out.

Shape legend: B batch, S sequence, D model width, H heads, N nope channels, R rope channels, V value
channels, L kv latent (kv_lora_rank), Q query latent (q_lora_rank).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.attention.registry import AttentionSpec, causal_context, register
from moe_dag.training.attention.rotary import Rotary
from moe_dag.training.config import ModelConfig


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _dims(config: ModelConfig) -> tuple[int, int, int]:
    mla = config.mla
    nope = mla.qk_nope_head_dim or config.head_dim
    value = mla.v_head_dim or config.head_dim
    return nope, mla.qk_rope_head_dim, value


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D, H, mla = config.d_model, config.n_heads, config.mla
        self.n_heads = H
        self.nope_dim, self.rope_dim, self.value_dim = _dims(config)
        query_width = H * (self.nope_dim + self.rope_dim)
        if mla.q_lora_rank:
            self.wq_a = nn.Linear(D, mla.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(mla.q_lora_rank, eps=config.norm_eps)
            self.wq_b = nn.Linear(mla.q_lora_rank, query_width, bias=False)
        else:
            self.wq = nn.Linear(D, query_width, bias=False)
        self.wkv_a = nn.Linear(D, mla.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(mla.kv_lora_rank, eps=config.norm_eps)
        self.wkv_b = nn.Linear(mla.kv_lora_rank, H * (self.nope_dim + self.value_dim), bias=False)
        self.wo = nn.Linear(H * self.value_dim, D, bias=False)
        self.kv_lora_rank = mla.kv_lora_rank

    def init_weights(self, std: float, residual_std: float) -> None:
        for module in self.children():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=residual_std if module is self.wo else std)
            else:
                nn.init.ones_(module.weight)

    def _queries(self, x_BSD: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        B, S, _ = x_BSD.shape
        # Norms in fp32: under autocast the latents arrive in bf16.
        q = (
            self.wq_b(self.q_norm(_at_least_fp32(self.wq_a(x_BSD))))
            if hasattr(self, "wq_a")
            else self.wq(x_BSD)
        )
        q_BHSX = q.view(B, S, self.n_heads, -1).transpose(1, 2)
        q_nope_BHSN, q_rope_BHSR = q_BHSX.split((self.nope_dim, self.rope_dim), dim=-1)
        return q_nope_BHSN, rotary(q_rope_BHSR)

    def _latents(self, x_BSD: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, torch.Tensor]:
        c_kv_BSL, k_rope_BSR = self.wkv_a(x_BSD).split((self.kv_lora_rank, self.rope_dim), dim=-1)
        return self.kv_norm(_at_least_fp32(c_kv_BSL)), rotary(k_rope_BSR.unsqueeze(1))  # k_rope: [B, 1, S, R]

    def _scale(self) -> float:
        return 1 / math.sqrt(self.nope_dim + self.rope_dim)

    def _output(self, y_BHSV: torch.Tensor) -> torch.Tensor:
        B, _, S, _ = y_BHSV.shape
        return self.wo(y_BHSV.transpose(1, 2).reshape(B, S, -1))

    def forward(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        B, S, _ = x_BSD.shape
        q_nope_BHSN, q_rope_BHSR = self._queries(x_BSD, rotary)
        c_kv_BSL, k_rope_B1SR = self._latents(x_BSD, rotary)
        kv_BHSX = self.wkv_b(c_kv_BSL).view(B, S, self.n_heads, -1).transpose(1, 2)
        k_nope_BHSN, v_BHSV = kv_BHSX.split((self.nope_dim, self.value_dim), dim=-1)
        q_BHSX = torch.cat((q_nope_BHSN, q_rope_BHSR), dim=-1)
        k_BHSX = torch.cat((k_nope_BHSN, k_rope_B1SR.expand(-1, self.n_heads, -1, -1)), dim=-1)
        y_BHSV = F.scaled_dot_product_attention(q_BHSX, k_BHSX, v_BHSV, is_causal=True, scale=self._scale())
        return self._output(y_BHSV)

    def reference(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        S = x_BSD.shape[1]
        q_nope_BHSN, q_rope_BHSR = self._queries(x_BSD, rotary)
        c_kv_BSL, k_rope_B1SR = self._latents(x_BSD, rotary)
        w_HXL = self.wkv_b.weight.view(self.n_heads, self.nope_dim + self.value_dim, self.kv_lora_rank)
        w_uk_HNL, w_uv_HVL = w_HXL.split((self.nope_dim, self.value_dim), dim=1)
        q_latent_BHSL = torch.einsum("bhsn,hnl->bhsl", q_nope_BHSN, w_uk_HNL)
        scores_BHSS = q_latent_BHSL @ c_kv_BSL.unsqueeze(1).transpose(-2, -1)
        scores_BHSS = (scores_BHSS + q_rope_BHSR @ k_rope_B1SR.transpose(-2, -1)) * self._scale()
        causal_SS = torch.ones(S, S, dtype=torch.bool, device=x_BSD.device).tril()
        p_BHSS = scores_BHSS.masked_fill(~causal_SS, float("-inf")).softmax(dim=-1)
        y_latent_BHSL = p_BHSS @ c_kv_BSL.unsqueeze(1)
        return self._output(torch.einsum("bhsl,hvl->bhsv", y_latent_BHSL, w_uv_HVL))


def _parameters(config: ModelConfig) -> int:
    D, H, mla = config.d_model, config.n_heads, config.mla
    nope, rope, value = _dims(config)
    if mla.q_lora_rank:
        query = D * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * H * (nope + rope)
    else:
        query = D * H * (nope + rope)
    kv = D * (mla.kv_lora_rank + rope) + mla.kv_lora_rank + mla.kv_lora_rank * H * (nope + value)
    return query + kv + H * value * D


def _mixing_flops(config: ModelConfig, seq_len: int) -> float:
    nope, rope, value = _dims(config)
    return 2 * config.n_heads * (nope + rope + value) * causal_context(seq_len)


register(
    "mla",
    AttentionSpec(
        build=MultiHeadLatentAttention,
        num_parameters=_parameters,
        mixing_flops=_mixing_flops,
        rotary_dim=lambda c: c.mla.qk_rope_head_dim,
    ),
)
