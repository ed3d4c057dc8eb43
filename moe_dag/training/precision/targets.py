"""Which matrix products a low-precision recipe converts.

The linear layers inside transformer blocks and the routed experts, except in the first and last
`edge_layers` blocks, which stay in bf16 with the embedding, the output head, the norms and the
routers (router math is fp32 whatever the recipe).
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from moe_dag.training.model import Transformer
from moe_dag.training.moe import MoE, RoutedExperts, Router


def low_precision_blocks(model: Transformer, edge_layers: int) -> list[nn.Module]:
    n = len(model.layers)
    return [block for i, block in enumerate(model.layers) if edge_layers <= i < n - edge_layers]


def linear_layers(block: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute name, linear) for each nn.Linear in `block`, routers left out."""
    for parent in block.modules():
        if isinstance(parent, Router):
            continue
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                yield parent, name, child


def expert_layers(block: nn.Module) -> Iterator[tuple[MoE, RoutedExperts]]:
    for module in block.modules():
        if isinstance(module, MoE) and isinstance(module.experts, RoutedExperts):
            yield module, module.experts
