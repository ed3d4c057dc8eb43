"""Is the run healthy? Router statistics per MoE layer every step, and NaN and loss-spike detection.

`RouterHealth.observe(load_LE)` turns the expert loads of the step (the all-reduced counts the bias
update used) and the layers' `router_stats` into one record per step:

| key              | per MoE layer                                                              |
| ---------------- | -------------------------------------------------------------------------- |
| layers           | the block index of each MoE layer                                          |
| load             | routed (token, expert) pairs per expert this step                          |
| max_over_mean    | max(load) / mean(load): 1.0 is perfect balance, E / k is total collapse    |
| dead_experts     | experts that received no token in the last `dead_expert_window` steps     |
| entropy          | mean entropy of the tokens' normalised router affinities (nats; max ln E)  |
| bias_min, bias_max | range of the expert-selection bias                                       |
| dropped_fraction | share of (token, expert) pairs over the capacity limit (0 when dropless)   |

`AnomalyDetector.check(step, loss, model)` runs between backward and the optimizer step. A
non-finite loss, or one above `spike_factor` x the mean of the last `spike_window` losses, is
reported with the step and where it points (for a NaN: the first non-finite weight, else the first
MoE layer whose router saw non-finite inputs, else the first non-finite gradient; for a spike: the
block with the largest gradient norm); with `health.stop_on` covering it, `TrainingAnomaly` stops
the run before the step is applied, so the newest checkpoint stays good.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from moe_dag.training.config import HealthConfig
from moe_dag.training.model import Transformer
from moe_dag.training.moe import ROUTER_STATS

log = logging.getLogger(__name__)


class TrainingAnomaly(RuntimeError):
    pass


class RouterHealth:
    def __init__(
        self,
        model: Transformer,
        config: HealthConfig,
        all_reduce: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.moe_layers, self.layers = model.moe_layers(), model.moe_layer_indices()
        self.all_reduce = all_reduce
        self.recent_loads: collections.deque[torch.Tensor] = collections.deque(
            maxlen=config.dead_expert_window
        )

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Refill the dead-expert window from logged steps (on resume)."""
        for record in records:
            if "router" in record:
                self.recent_loads.append(torch.tensor(record["router"]["load"]))

    @torch.no_grad()
    def observe(self, load_LE: torch.Tensor) -> dict[str, Any] | None:
        if not self.moe_layers:
            return None
        stats_LS = torch.stack([moe.router_stats for moe in self.moe_layers])
        if self.all_reduce is not None:
            self.all_reduce(stats_LS)
        for moe in self.moe_layers:
            moe.router_stats.zero_()
        stats = {name: stats_LS[:, i] for i, name in enumerate(ROUTER_STATS)}
        tokens = stats["tokens"].clamp_min(1)
        load_LE = load_LE.cpu()
        self.recent_loads.append(load_LE)
        window_LE = torch.stack(list(self.recent_loads)).sum(dim=0)
        bias_LE = torch.stack([moe.router.expert_bias_E for moe in self.moe_layers]).cpu()
        top_k = self.moe_layers[0].top_k
        return {
            "layers": self.layers,
            "load": load_LE.tolist(),
            "max_over_mean": (load_LE.max(dim=1).values / load_LE.mean(dim=1).clamp_min(1e-9)).tolist(),
            "dead_experts": (window_LE == 0).sum(dim=1).tolist(),
            "entropy": (stats["entropy_sum"] / tokens).tolist(),
            "bias_min": bias_LE.min(dim=1).values.tolist(),
            "bias_max": bias_LE.max(dim=1).values.tolist(),
            "dropped_fraction": (stats["dropped_pairs"] / (tokens * top_k)).tolist(),
            "nonfinite_tokens": stats["nonfinite_tokens"].tolist(),
        }


class AnomalyDetector:
    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.recent_losses: collections.deque[float] = collections.deque(maxlen=config.spike_window)

    def replay(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            if math.isfinite(record["loss"]):
                self.recent_losses.append(record["loss"])

    def check(self, step: int, loss: float, model: Transformer) -> None:
        """Raise `TrainingAnomaly` or log a warning for a NaN or a spike; else remember the loss."""
        config = self.config
        if not math.isfinite(loss):
            self._report(
                f"step {step}: loss is {loss} ({_nan_origin(model)})", stop=config.stop_on != "never"
            )
            return
        if len(self.recent_losses) >= config.spike_min_steps:
            mean = sum(self.recent_losses) / len(self.recent_losses)
            if loss > config.spike_factor * mean:
                self._report(
                    f"step {step}: loss spike {loss:.4f} > {config.spike_factor} x running mean {mean:.4f} "
                    f"over {len(self.recent_losses)} steps (largest gradient: {_largest_gradient(model)})",
                    stop=config.stop_on == "nan_or_spike",
                )
        self.recent_losses.append(loss)

    def _report(self, message: str, stop: bool) -> None:
        if stop:
            raise TrainingAnomaly(f"{message}; stopping the run (health.stop_on={self.config.stop_on})")
        log.warning("%s; continuing (health.stop_on=%s)", message, self.config.stop_on)


def _nan_origin(model: Transformer) -> str:
    """Where a non-finite loss comes from: a weight, else the first MoE layer whose router saw
    non-finite inputs (an activation overflow upstream of it), else the first non-finite gradient."""
    for name, parameter in model.named_parameters():
        if not torch.isfinite(parameter).all():
            return f"first non-finite weight: {name}"
    for i, moe in zip(model.moe_layer_indices(), model.moe_layers(), strict=True):
        if moe.router_stats[ROUTER_STATS.index("nonfinite_tokens")] > 0:
            return f"first MoE layer whose router saw non-finite inputs: layer {i}"
    for name, parameter in model.named_parameters():
        if parameter.grad is not None and not torch.isfinite(parameter.grad).all():
            return f"first non-finite gradient: {name}"
    return "no weight, router input or gradient is non-finite: look at the data and the head"


def _largest_gradient(model: Transformer) -> str:
    norms = []
    for i, block in enumerate(model.layers):
        grads = [p.grad for p in block.parameters() if p.grad is not None]
        if grads:
            norms.append((torch.nn.utils.get_total_norm(grads).item(), i))
    if not norms:
        return "no gradients"
    norm, layer = max(norms)
    return f"layer {layer}, norm {norm:.3g}"
