"""AdamW with decay and no-decay parameter groups, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from moe_dag.training.config import OptimConfig


def parameter_groups(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decay, no_decay): matrices decay; norms, scalars, biases and the embedding table do not.

    The embedding is a lookup table, not a projection: weight decay would pull rare tokens' rows to zero.
    """
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.ndim >= 2 and "tok_embeddings" not in name:
            decay.append(parameter)
        else:
            no_decay.append(parameter)
    seen = [id(p) for p in decay + no_decay]
    assert len(seen) == len(set(seen)) == len(list(model.parameters())), (
        "a parameter is in zero or two groups"
    )
    return decay, no_decay


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    decay, no_decay = parameter_groups(model)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        foreach=True,
    )


def lr_multiplier(step: int, total_steps: int, config: OptimConfig) -> float:
    """Linear warmup over `warmup_steps`, then cosine decay to `min_lr_ratio` at `total_steps`."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, config: OptimConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total_steps, config))
