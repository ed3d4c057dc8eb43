"""Causal self-attention variants with rotary positions.

Each variant is a module with `forward(x_BSD, cos_SR, sin_SR) -> y_BSD`; `build_attention` picks one per
layer from `ModelConfig.attention_kind(layer)`, so further kinds (MLA, NSA, KDA) only add a class and a
line there.

Shape legend: B batch, S sequence, D model width, H query heads, G key/value heads, C channels per
head, R rotary frequencies (C / 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.config import ModelConfig


def rotary_tables(
    seq_len: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, shape [S, R], for RoPE (arXiv:2104.09864)."""
    freq_R = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angle_SR = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freq_R)
    return angle_SR.cos(), angle_SR.sin()


def apply_rotary(x_BHSC: torch.Tensor, cos_SR: torch.Tensor, sin_SR: torch.Tensor) -> torch.Tensor:
    # The half-split layout (GPT-NeoX, nanochat): pairs channel i with channel i + C/2.
    x1, x2 = x_BHSC.chunk(2, dim=-1)
    return torch.cat((x1 * cos_SR - x2 * sin_SR, x1 * sin_SR + x2 * cos_SR), dim=-1)


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

    def forward(self, x_BSD: torch.Tensor, cos_SR: torch.Tensor, sin_SR: torch.Tensor) -> torch.Tensor:
        B, S, _ = x_BSD.shape
        q_BHSC = self.wq(x_BSD).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k_BGSC = self.wk(x_BSD).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BGSC = self.wv(x_BSD).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q_BHSC = apply_rotary(q_BHSC, cos_SR[:S], sin_SR[:S])
        k_BGSC = apply_rotary(k_BGSC, cos_SR[:S], sin_SR[:S])
        grouped = self.n_kv_heads != self.n_heads
        if self.window is None:
            y_BHSC = F.scaled_dot_product_attention(
                q_BHSC, k_BGSC, v_BGSC, is_causal=True, enable_gqa=grouped
            )
        else:
            mask_SS = sliding_window_mask(S, self.window, x_BSD.device)
            y_BHSC = F.scaled_dot_product_attention(
                q_BHSC, k_BGSC, v_BGSC, attn_mask=mask_SS, enable_gqa=grouped
            )
        return self.wo(y_BHSC.transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim))


def sliding_window_mask(seq_len: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean [S, S] mask, True where query i may attend key j: j <= i and i - j < window."""
    offset_SS = torch.arange(seq_len, device=device)[:, None] - torch.arange(seq_len, device=device)[None, :]
    return (offset_SS >= 0) & (offset_SS < window)


def build_attention(config: ModelConfig, layer: int) -> nn.Module:
    kind = config.attention_kind(layer)
    if kind == "mha":
        return GroupedQueryAttention(config, n_kv_heads=config.n_heads, window=None)
    if kind == "gqa":
        return GroupedQueryAttention(config, n_kv_heads=config.n_kv_heads, window=None)
    if kind == "swa":
        return GroupedQueryAttention(config, n_kv_heads=config.n_kv_heads, window=config.sliding_window)
    raise ValueError(f"model.attention_pattern: unknown attention kind {kind!r} at layer {layer}")
