"""Auxiliary-loss-free load balancing, applied from outside the model as an optimizer pre-step hook.

Before each optimizer step, for every MoE layer: load_E = tokens routed to each expert since the last
step (summed over data-parallel ranks when `all_reduce` is given), then

    expert_bias_E += rate * sign(mean(load_E) - load_E)

so overloaded experts become less likely to be chosen and idle ones more likely (DeepSeek-V3,
arXiv:2412.19437, sec. 2.1.2). Every rank applies the same update to the same summed counts, so the
biases stay identical without being broadcast. The step is also where the load imbalance is measured.

Shape legend: L MoE layers, E routed experts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from moe_dag.training.moe import MoE


class ExpertBiasUpdater:
    def __init__(
        self,
        moe_layers: list[MoE],
        rate: float,
        all_reduce: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.moe_layers, self.rate, self.all_reduce = moe_layers, rate, all_reduce
        # max(load) / mean(load) per MoE layer at the last update: 1.0 is perfect balance.
        self.imbalance: list[float] = []
        # The (all-reduced) load of the last update, [MoE layers, experts], for the health record.
        self.load_LE = torch.zeros(len(moe_layers), moe_layers[0].num_experts if moe_layers else 0)

    def register(self, optimizer: torch.optim.Optimizer) -> Any:
        return optimizer.register_step_pre_hook(self._pre_step_hook)

    def _pre_step_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.update()

    @torch.no_grad()
    def update(self) -> None:
        if not self.moe_layers:
            return
        load_LE = torch.stack([moe.tokens_per_expert_E for moe in self.moe_layers])
        if self.all_reduce is not None:
            self.all_reduce(load_LE)
        self.load_LE = load_LE.clone()
        mean_L1 = load_LE.mean(dim=1, keepdim=True)
        self.imbalance = (load_LE.max(dim=1).values / mean_L1.squeeze(1).clamp_min(1e-9)).tolist()
        delta_LE = self.rate * torch.sign(mean_L1 - load_LE)
        for moe, delta_E in zip(self.moe_layers, delta_LE, strict=True):
            moe.router.expert_bias_E += delta_E
            moe.tokens_per_expert_E.zero_()
