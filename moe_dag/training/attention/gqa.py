"""Causal softmax attention with shared key/value heads: MHA, GQA and sliding-window attention.

Shape legend: B batch, S sequence (queries), T keys, D model width, H query heads, G key/value heads,
C channels per head.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.attention.registry import AttentionSpec, causal_context, register
from moe_dag.training.attention.rotary import Rotary
from moe_dag.training.config import ModelConfig


def sliding_window_mask(seq_len: int, window: int, device: torch.device | str) -> torch.Tensor:
    """Boolean [S, S] mask, True where query i may attend key j: j <= i and i - j < window."""
    offset_SS = torch.arange(seq_len, device=device)[:, None] - torch.arange(seq_len, device=device)[None, :]
    return (offset_SS >= 0) & (offset_SS < window)


def explicit_attention(
    q_BHSC: torch.Tensor, k_BHTC: torch.Tensor, v_BHTC: torch.Tensor, mask_ST: torch.Tensor
) -> torch.Tensor:
    """softmax(q k^T / sqrt(C) where allowed) v, written out: the reference for the fused paths."""
    scores = q_BHSC @ k_BHTC.transpose(-2, -1) / math.sqrt(q_BHSC.shape[-1])
    return scores.masked_fill(~mask_ST, float("-inf")).softmax(dim=-1) @ v_BHTC


class GroupedQueryAttention(nn.Module):
    """Causal attention with `n_kv_heads` key/value heads shared by groups of query heads.

    n_kv_heads == n_heads is plain multi-head attention. With `window` set, each query sees only the
    `window` most recent positions including its own (sliding-window attention, as in Mistral).
    """

    def __init__(self, config: ModelConfig, n_kv_heads: int, window: int | None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, n_kv_heads, config.head_dim
        self.window = window
        self.wq = nn.Linear(config.d_model, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.d_model, n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.d_model, n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.d_model, bias=False)

    def init_weights(self, std: float, residual_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.wo.weight, std=residual_std)

    def _project(self, x_BSD: torch.Tensor, rotary: Rotary) -> tuple[torch.Tensor, ...]:
        B, S, _ = x_BSD.shape
        q_BHSC = self.wq(x_BSD).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k_BGSC = self.wk(x_BSD).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BGSC = self.wv(x_BSD).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return rotary(q_BHSC), rotary(k_BGSC), v_BGSC

    def _output(self, y_BHSC: torch.Tensor) -> torch.Tensor:
        B, _, S, _ = y_BHSC.shape
        return self.wo(y_BHSC.transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim))

    def forward(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        q_BHSC, k_BGSC, v_BGSC = self._project(x_BSD, rotary)
        grouped = self.n_kv_heads != self.n_heads
        if self.window is None:
            y_BHSC = F.scaled_dot_product_attention(
                q_BHSC, k_BGSC, v_BGSC, is_causal=True, enable_gqa=grouped
            )
        else:
            mask_SS = sliding_window_mask(x_BSD.shape[1], self.window, x_BSD.device)
            y_BHSC = F.scaled_dot_product_attention(
                q_BHSC, k_BGSC, v_BGSC, attn_mask=mask_SS, enable_gqa=grouped
            )
        return self._output(y_BHSC)

    def reference(self, x_BSD: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        q_BHSC, k_BGSC, v_BGSC = self._project(x_BSD, rotary)
        group = self.n_heads // self.n_kv_heads
        S = x_BSD.shape[1]
        window = self.window or S
        mask_SS = sliding_window_mask(S, window, x_BSD.device)
        k_BHSC, v_BHSC = k_BGSC.repeat_interleave(group, dim=1), v_BGSC.repeat_interleave(group, dim=1)
        return self._output(explicit_attention(q_BHSC, k_BHSC, v_BHSC, mask_SS))


def _parameters(config: ModelConfig, kv_heads: int) -> int:
    D, C, H = config.d_model, config.head_dim, config.n_heads
    return 2 * D * H * C + 2 * D * kv_heads * C


def _mixing_flops(config: ModelConfig, seq_len: int, window: int | None) -> float:
    # q k^T and p v: 2 multiply-adds per channel per key, each 2 FLOPs.
    return 4 * config.n_heads * config.head_dim * causal_context(seq_len, window)


def _spec(
    kv_heads: Callable[[ModelConfig], int], window: Callable[[ModelConfig], int | None]
) -> AttentionSpec:
    return AttentionSpec(
        build=lambda c: GroupedQueryAttention(c, n_kv_heads=kv_heads(c), window=window(c)),
        num_parameters=lambda c: _parameters(c, kv_heads(c)),
        mixing_flops=lambda c, s: _mixing_flops(c, s, window(c)),
        rotary_dim=lambda c: c.head_dim,
    )


register("mha", _spec(lambda c: c.n_heads, lambda c: None))
register("gqa", _spec(lambda c: c.n_kv_heads, lambda c: None))
register("swa", _spec(lambda c: c.n_kv_heads, lambda c: c.sliding_window))
