"""FP8 and NVFP4 training numerics in plain PyTorch: the CPU twin of the Transformer Engine recipes.

Each converted matrix product y = x w^T runs as
    forward:  y  = Q_a(x) Q_w(w)^T                 (fp32 accumulation)
    backward: dx = Q_a(dy) Q_w(w),  dw = Q_a(dy)^T Q_a(x)
with Q_a the activation tiling (1 x 128 for fp8) and Q_w the weight blocking (128 x 128), so the
forward and both backward products see quantized operands, as DeepSeek-V3's FP8 framework (arXiv:
2412.19437 sec. 3.3) and TE's block-scaling recipe do. It is built from two small autograd
functions: one rounds its input and passes gradients straight through (the rounding's derivative
taken as 1), the other is the identity forward and rounds the gradient flowing back into the
product. Because the emulation dequantizes before an fp32 product, a tile's orientation only
changes which values share a scale; gradients use the same 1 x 128 tiles along their last dimension
where hardware would use 128 x 1 tiles for the weight-gradient product.

`convert(model, fmt, edge_layers)` switches a model's linear layers (in place: parameters, names and
checkpoints are unchanged) and routed experts to these products.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from moe_dag.training.grouped_mm import grouped_mm
from moe_dag.training.model import Transformer
from moe_dag.training.precision.formats import BlockFormat, fake_quantize
from moe_dag.training.precision.targets import expert_layers, linear_layers, low_precision_blocks


class _RoundStraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, block: tuple[int, int], fmt: BlockFormat) -> torch.Tensor:
        return fake_quantize(x, block, fmt)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class _RoundGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
        ctx.fmt = fmt
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return fake_quantize(grad, ctx.fmt.activation_block, ctx.fmt).to(grad.dtype), None


def _output_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def quantized_linear(x: torch.Tensor, weight: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    dtype = _output_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        y = F.linear(
            _RoundStraightThrough.apply(x, fmt.activation_block, fmt),
            _RoundStraightThrough.apply(weight, fmt.weight_block, fmt),
        )
    return _RoundGradient.apply(y, fmt).to(dtype)


def quantized_grouped_mm(
    x_MK: torch.Tensor, w_ENK: torch.Tensor, counts_E: torch.Tensor, *, fmt: BlockFormat
) -> torch.Tensor:
    """`grouped_mm` with quantized operands: weights blocked per expert, activations per row tile."""
    dtype = _output_dtype(x_MK)
    with torch.autocast(x_MK.device.type, enabled=False):
        y_MN = grouped_mm(
            _RoundStraightThrough.apply(x_MK, fmt.activation_block, fmt),
            _RoundStraightThrough.apply(w_ENK, fmt.weight_block, fmt),
            counts_E,
        )
    return _RoundGradient.apply(y_MN, fmt).to(dtype)


class QuantizedLinear(nn.Linear):
    """nn.Linear whose product runs through `quantized_linear`; made by `convert`, never built."""

    fmt: BlockFormat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = quantized_linear(x, self.weight, self.fmt)
        return y if self.bias is None else y + self.bias


def convert(model: Transformer, fmt: BlockFormat, edge_layers: int) -> None:
    for block in low_precision_blocks(model, edge_layers):
        for _, _, linear in list(linear_layers(block)):
            # A class swap rather than a new module: the parameters, their names, the optimizer's
            # references and the checkpoint layout all stay the same.
            linear.__class__ = QuantizedLinear
            linear.fmt = fmt
        for _, experts in expert_layers(block):
            experts.grouped_mm = functools.partial(quantized_grouped_mm, fmt=fmt)
