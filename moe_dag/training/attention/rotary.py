"""Rotary position embedding (RoPE, arXiv:2104.09864), one table per rotary width the model uses.

MLA rotates a narrow decoupled part of each head while GQA rotates whole heads, so the model keeps a
table per width; `Rotary(x)` picks the one matching x's last dimension.

Shape legend: S sequence, R rotary frequencies (C / 2), C rotated channels.
"""

from __future__ import annotations

import torch
from torch import nn


def rotary_tables(
    seq_len: int, head_dim: int, theta: float, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, shape [S, R]."""
    freq_R = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angle_SR = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freq_R)
    return angle_SR.cos(), angle_SR.sin()


def apply_rotary(x_BHSC: torch.Tensor, cos_SR: torch.Tensor, sin_SR: torch.Tensor) -> torch.Tensor:
    # The half-split layout (GPT-NeoX, nanochat): pairs channel i with channel i + C/2.
    x1, x2 = x_BHSC.chunk(2, dim=-1)
    cos_SR, sin_SR = cos_SR.to(x_BHSC.dtype), sin_SR.to(x_BHSC.dtype)
    return torch.cat((x1 * cos_SR - x2 * sin_SR, x1 * sin_SR + x2 * cos_SR), dim=-1)


class Rotary(nn.Module):
    def __init__(self, seq_len: int, dims: list[int], theta: float) -> None:
        super().__init__()
        self.seq_len, self.dims, self.theta = seq_len, sorted(set(dims)), theta
        for dim in self.dims:
            self.register_buffer(f"cos_{dim}", torch.empty(seq_len, dim // 2), persistent=False)
            self.register_buffer(f"sin_{dim}", torch.empty(seq_len, dim // 2), persistent=False)

    @torch.no_grad()
    def init_tables(self) -> None:
        for dim in self.dims:
            cos_SR, sin_SR = rotary_tables(self.seq_len, dim, self.theta, getattr(self, f"cos_{dim}").device)
            getattr(self, f"cos_{dim}").copy_(cos_SR)
            getattr(self, f"sin_{dim}").copy_(sin_SR)

    def forward(self, x_BHSC: torch.Tensor) -> torch.Tensor:
        S, C = x_BHSC.shape[-2:]
        return apply_rotary(x_BHSC, getattr(self, f"cos_{C}")[:S], getattr(self, f"sin_{C}")[:S])
