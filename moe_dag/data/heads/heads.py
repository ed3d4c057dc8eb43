"""The two quality heads read by early-exit scoring; both predict the oracle quality in [0, 1].

ProbeHead, at the probe layer: masked mean pool over tokens, then one linear map. It is cheap enough to
score every document, so it decides who leaves early. The pooled features are standardised with
per-feature statistics fixed at training time (buffers, not parameters): residual-stream scales differ by
orders of magnitude between backbones and layers, and a fixed affine map keeps the head exactly
"mean pool + linear" while making one learning rate work for all of them.

JudgeHead, at the judge layer: per-token LayerNorm (same reason), projection to d_model, a learned query
token prepended, a small pre-norm TransformerEncoder, and a linear map read off the query token. Token
order is already encoded in the backbone's hidden states, so the head adds no positional embedding.

A sigmoid bounds both outputs to the range of the target.

Tensor shape letters: B batch, T tokens, S = T + 1 (query and tokens), D backbone hidden size, M judge
width (d_model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def masked_mean(hidden_BTD: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean over the real (mask 1) tokens of each row, (B, D)."""
    weights_BT1 = mask_BT.unsqueeze(-1).to(hidden_BTD.dtype)
    return (hidden_BTD * weights_BT1).sum(1) / weights_BT1.sum(1).clamp(min=1.0)


class ProbeHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.register_buffer("feature_mean", torch.zeros(hidden_size))
        self.register_buffer("feature_std", torch.ones(hidden_size))
        self.linear = nn.Linear(hidden_size, 1)

    def set_feature_stats(self, pooled_ND: torch.Tensor) -> None:
        """Fix the standardisation from the training set's pooled features."""
        self.feature_mean.copy_(pooled_ND.mean(0))
        self.feature_std.copy_(pooled_ND.std(0).clamp(min=1e-6))

    def score_pooled(self, pooled_BD: torch.Tensor) -> torch.Tensor:
        standardised_BD = (pooled_BD - self.feature_mean) / self.feature_std
        return torch.sigmoid(self.linear(standardised_BD).squeeze(-1))

    def forward(self, hidden_BTD: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        return self.score_pooled(masked_mean(hidden_BTD, mask_BT))


@dataclass(kw_only=True)
class JudgeHeadConfig:
    # The design's width; the CPU demo uses a much smaller one (training cost grows with d_model squared).
    d_model: int = 512
    n_layers: int = 2
    n_heads: int = 8
    ffn_multiplier: int = 4
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"JudgeHeadConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )


class JudgeHead(nn.Module):
    def __init__(self, hidden_size: int, config: JudgeHeadConfig):
        super().__init__()
        self.config = config
        self.input_norm = nn.LayerNorm(hidden_size)
        self.project = nn.Linear(hidden_size, config.d_model)
        self.query = nn.Parameter(torch.randn(1, 1, config.d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            config.d_model,
            config.n_heads,
            dim_feedforward=config.ffn_multiplier * config.d_model,
            dropout=config.dropout,
            batch_first=True,
            norm_first=True,
        )
        # Pre-norm layers leave the residual stream unnormalised, hence the final norm.
        self.encoder = nn.TransformerEncoder(
            layer, config.n_layers, norm=nn.LayerNorm(config.d_model), enable_nested_tensor=False
        )
        self.out = nn.Linear(config.d_model, 1)

    def forward(self, hidden_BTD: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        tokens_BTM = self.project(self.input_norm(hidden_BTD))
        query_B1M = self.query.expand(tokens_BTM.shape[0], -1, -1)
        x_BSM = torch.cat([query_B1M, tokens_BTM], dim=1)
        # True marks what attention must ignore: the padding, never the query.
        ignore_BS = torch.cat([torch.ones_like(mask_BT[:, :1]), mask_BT], dim=1) == 0
        x_BSM = self.encoder(x_BSM, src_key_padding_mask=ignore_BS)
        return torch.sigmoid(self.out(x_BSM[:, 0]).squeeze(-1))


@dataclass
class QualityHeads:
    """A probe and a judge trained together on one backbone's layers."""

    probe: ProbeHead
    judge: JudgeHead

    def eval(self) -> QualityHeads:
        self.probe.eval()
        self.judge.eval()
        return self

    def to(self, device: torch.device | str) -> QualityHeads:
        self.probe.to(device)
        self.judge.to(device)
        return self
