"""The fp8 and nvfp4 recipes on NVIDIA GPUs, through Transformer Engine (the `gpu` extra).

`convert` swaps the linear layers of the low-precision blocks for `te.Linear` and their routed
experts for `te.GroupedLinear` (weights copied from the fp32 master weights, which stay fp32 and are
what the optimizer updates); the forward runs inside `torch.autocast(bf16)` and TE's quantization
autocast with the chosen recipe:

| precision.recipe | precision.fp8_scaling | TE recipe                                                  |
| ---------------- | --------------------- | ---------------------------------------------------------- |
| fp8              | delayed               | DelayedScaling (per-tensor scales from an amax history)   |
| fp8              | current               | Float8CurrentScaling (per-tensor scales of this step)     |
| fp8              | block                 | Float8BlockScaling (1x128 / 128x128; Hopper, CUDA 12.9+)  |
| nvfp4            | -                     | NVFP4BlockScaling (Blackwell)                             |

FP8 GEMMs need dimensions divisible by 16: a linear layer that is not stays in bf16, and expert row
groups are padded to the recipe's alignment (te.Fp8Padding / te.Fp8Unpadding).

Converted experts keep TE's parameter names (w13.weight<e>, w2.weight<e>), so such a checkpoint loads
into a model converted the same way.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch import nn

from moe_dag.training.config import PrecisionConfig
from moe_dag.training.model import Transformer
from moe_dag.training.moe import RoutedExperts
from moe_dag.training.precision.targets import expert_layers, linear_layers, low_precision_blocks

log = logging.getLogger(__name__)


def import_transformer_engine() -> Any:
    try:
        import transformer_engine.pytorch as te
    except ImportError as error:
        raise ImportError(
            "precision.recipe fp8 and nvfp4 need NVIDIA Transformer Engine: install the `gpu` extra "
            "(pip install 'moe-dag[gpu]', or make setup EXTRAS=dev,gpu) on a machine with a CUDA torch; "
            "on a CPU use precision.recipe=fp8-emulated or nvfp4-emulated"
        ) from error
    return te


def te_recipe(config: PrecisionConfig) -> Any:
    from transformer_engine.common import recipe

    if config.recipe == "nvfp4":
        return recipe.NVFP4BlockScaling()
    if config.fp8_scaling == "delayed":
        return recipe.DelayedScaling(
            fp8_format=recipe.Format.HYBRID, amax_history_len=1024, amax_compute_algo="max"
        )
    if config.fp8_scaling == "current":
        return recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)
    return recipe.Float8BlockScaling(fp8_format=recipe.Format.E4M3)


class TEGroupedExperts(nn.Module):
    """The routed experts as two te.GroupedLinear layers (w1 and w3 fused), one GEMM group per expert."""

    def __init__(self, experts: RoutedExperts, te: Any, align: int) -> None:
        super().__init__()
        E, F_, D = experts.w1_EFD.shape
        device = experts.w1_EFD.device
        self.hidden = F_
        self.w13 = te.GroupedLinear(E, D, 2 * F_, bias=False, params_dtype=torch.float32, device=device)
        self.w2 = te.GroupedLinear(E, F_, D, bias=False, params_dtype=torch.float32, device=device)
        self.pad, self.unpad = te.Fp8Padding(E, align_size=align), te.Fp8Unpadding(E, align_size=align)
        with torch.no_grad():
            for e in range(E):
                getattr(self.w13, f"weight{e}").copy_(torch.cat((experts.w1_EFD[e], experts.w3_EFD[e])))
                getattr(self.w2, f"weight{e}").copy_(experts.w2_EDF[e])

    def forward(self, x_MD: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """`RoutedExperts.forward`: expert-sorted rows in, their experts' outputs out."""
        splits = counts_E.tolist()  # TE takes the group sizes on the host
        padded_MD, padded_splits = self.pad(x_MD, splits)
        h13 = self.w13(padded_MD, padded_splits)
        h = torch.nn.functional.silu(h13[:, : self.hidden]) * h13[:, self.hidden :]
        return self.unpad(self.w2(h, padded_splits), splits)


def convert(model: Transformer, config: PrecisionConfig) -> None:
    te = import_transformer_engine()
    align = 128 if config.recipe == "nvfp4" else 16
    for block in low_precision_blocks(model, config.high_precision_edge_layers):
        for parent, name, linear in list(linear_layers(block)):
            if linear.in_features % 16 or linear.out_features % 16:
                log.info("%s stays in bf16: FP8 GEMMs need sizes divisible by 16", name)
                continue
            replacement = te.Linear(
                linear.in_features,
                linear.out_features,
                bias=False,
                params_dtype=torch.float32,
                device=linear.weight.device,
            )
            with torch.no_grad():
                replacement.weight.copy_(linear.weight)
            setattr(parent, name, replacement)
        for moe, experts in list(expert_layers(block)):
            moe.experts = TEGroupedExperts(experts, te, align)


@contextlib.contextmanager
def autocast(recipe: Any, device: torch.device) -> Any:
    te = import_transformer_engine()
    # te.autocast replaced te.fp8_autocast in Transformer Engine 2.x; older releases only have the latter.
    quantized = (
        te.autocast(enabled=True, recipe=recipe)
        if hasattr(te, "autocast")
        else te.fp8_autocast(enabled=True, fp8_recipe=recipe)
    )
    with torch.autocast(device.type, dtype=torch.bfloat16), quantized:
        yield
