"""The attention registry: each kind names how to build it, count its parameters and its FLOPs.

Every attention module has `forward(x_BSD, rotary) -> y_BSD`, `init_weights(std, residual_std)` and
`reference(x_BSD, rotary)`, a plain implementation of the same function that the tests compare with.
`ModelConfig.attention_kind(layer)` picks the kind per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from moe_dag.training.config import ModelConfig


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    build: Callable[[ModelConfig], nn.Module]
    num_parameters: Callable[[ModelConfig], int]
    # Forward FLOPs per token of the token mixing itself (scores and weighted values, or the
    # recurrent state), beyond the projections' 2 x parameters, at sequence length `seq_len`,
    # averaged over the causal positions.
    mixing_flops: Callable[[ModelConfig, int], float]
    # The rotary width the kind needs (0: no rotary positions).
    rotary_dim: Callable[[ModelConfig], int]


ATTENTION: dict[str, AttentionSpec] = {}


def register(kind: str, spec: AttentionSpec) -> None:
    assert kind not in ATTENTION, f"attention kind {kind!r} registered twice"
    ATTENTION[kind] = spec


def spec_for(config: ModelConfig, layer: int) -> AttentionSpec:
    kind = config.attention_kind(layer)
    if kind not in ATTENTION:
        raise ValueError(f"model.attention_pattern: unknown attention kind {kind!r} at layer {layer}")
    return ATTENTION[kind]


def causal_context(seq_len: int, window: int | None = None) -> float:
    """Keys a query sees on average under a causal mask (and a window, if any)."""
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2
    # Positions before `window` see t + 1 keys, the rest see `window`.
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len
