"""Optimizers (AdamW; Muon with AdamW for what Muon does not suit), parameter groups, LR schedules.

Parameter groups, each with its own learning rate (`optim.<group>_lr`, None: `optim.lr`):

| group      | parameters                                           | update (muon / adamw)  | decay |
| ---------- | ---------------------------------------------------- | ---------------------- | ----- |
| matrices   | nn.Linear weights in the blocks, stacked expert [E, ., .] weights | Muon / AdamW | yes |
| embedding  | tok_embeddings.weight (a lookup table: decay would pull rare rows to 0) | AdamW | no |
| head       | output.weight                                        | AdamW                  | yes   |
| router     | the routers' gate weights                            | AdamW                  | yes   |
| scalars    | norms, the MoE output scale, other vectors and gates' scalars | AdamW         | no    |

Muon (Keller Jordan, 2024; Moonlight, arXiv:2502.16982): momentum, then each matrix's update is
orthogonalised by 5 Newton-Schulz steps (quintic coefficients 3.4445, -4.7750, 2.0315), batched over
the experts of a stacked [E, A, B] weight, so each expert's matrix is orthogonalised alone. The
update is scaled by 0.2 sqrt(max(A, B)) so its RMS matches AdamW's (Moonlight sec. 2.2), which lets
Muon reuse AdamW's learning rate and decoupled weight decay.

Schedules: linear warmup, then cosine decay to `min_lr_ratio`, or warmup-stable-decay (hold the peak,
then decay linearly to `min_lr_ratio` over the last `decay_fraction` of the steps; arXiv:2404.06395).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from moe_dag.training.config import OptimConfig
from moe_dag.training.moe import RoutedExperts, Router

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)

# (group, uses weight decay, optim field with its learning rate)
GROUPS = (
    ("matrices", True, "lr"),
    ("embedding", False, "embedding_lr"),
    ("head", True, "head_lr"),
    ("router", True, "router_lr"),
    ("scalars", False, "scalar_lr"),
)


def parameter_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Every parameter in exactly one named group (see the module docstring)."""
    group_of: dict[int, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, Router):
            group_of[id(module.gate.weight)] = "router"
        elif isinstance(module, RoutedExperts):
            for parameter in module.parameters(recurse=False):
                group_of[id(parameter)] = "matrices"
        elif isinstance(module, nn.Linear) and name.startswith("layers."):
            group_of.setdefault(id(module.weight), "matrices")
    groups: dict[str, list[nn.Parameter]] = {name: [] for name, _, _ in GROUPS}
    for name, parameter in model.named_parameters():
        if name.startswith("tok_embeddings."):
            group = "embedding"
        elif name.startswith("output."):
            group = "head"
        else:
            group = group_of.get(id(parameter), "scalars")
        groups[group].append(parameter)
    seen = [id(p) for members in groups.values() for p in members]
    assert len(seen) == len(set(seen)) == len(list(model.parameters())), (
        "a parameter is in zero or two groups"
    )
    return groups


def _by_tensor_kind(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """FSDP2's sharded parameters (DTensors) and plain ones (expert-parallel experts) apart: one foreach
    kernel cannot take both."""
    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [kind for kind in (sharded, plain) if kind]


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    groups = []
    members = parameter_groups(model)
    for name, decays, lr_field in GROUPS:
        lr = getattr(config, lr_field)
        for params in _by_tensor_kind(members[name]):
            groups.append(
                {
                    "params": params,
                    "name": name,
                    "lr": config.lr if lr is None else lr,
                    "weight_decay": config.weight_decay if decays else 0.0,
                    "use_muon": config.name == "muon" and name == "matrices",
                }
            )
    if config.name == "adamw":
        return torch.optim.AdamW(
            groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, foreach=True
        )
    return Muon(
        groups,
        lr=config.lr,
        momentum=config.muon_momentum,
        ns_steps=config.muon_ns_steps,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
    )


def newton_schulz(g_XAB: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately U V^T for each matrix of g (one SVD-free orthogonalisation per leading index).

    The quintic iteration pushes every singular value towards 1 (into about [0.7, 1.2]: the
    coefficients trade exactness for speed). bf16 on GPUs as Muon's authors run it; fp32 elsewhere.
    """
    a, b, c = NS_COEFFICIENTS
    x = g_XAB.to(torch.bfloat16 if g_XAB.is_cuda else torch.float32)
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:  # iterate on the wide side: A A^T is then the smaller Gram matrix
        x = x.transpose(-2, -1)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = x @ x.transpose(-2, -1)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.transpose(-2, -1) if transposed else x).to(g_XAB.dtype)


class Muon(torch.optim.Optimizer):
    """Muon for groups with use_muon=True, AdamW (torch's own implementation) for the others."""

    def __init__(
        self,
        params: list[dict[str, Any]],
        lr: float,
        momentum: float = 0.95,
        ns_steps: int = 5,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            ns_steps=ns_steps,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            use_muon=False,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "Muon does not take a closure"
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_step(group)
            else:
                self._adamw_step(group)

    def _muon_step(self, group: dict[str, Any]) -> None:
        lr, wd, beta = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffer = state["momentum_buffer"]
            buffer.mul_(beta).add_(p.grad)
            nesterov = p.grad.add(buffer, alpha=beta)
            A, B = p.shape[-2:]
            update = newton_schulz(nesterov, group["ns_steps"]) * (0.2 * math.sqrt(max(A, B)))
            p.mul_(1 - lr * wd)
            p.add_(update, alpha=-lr)

    def _adamw_step(self, group: dict[str, Any]) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adamw(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            foreach=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )


def lr_multiplier(step: int, total_steps: int, config: OptimConfig) -> float:
    """The factor on each group's learning rate at `step` (0-based)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    floor = config.min_lr_ratio
    if config.schedule == "wsd":
        decay_steps = max(1, round(config.decay_fraction * total_steps))
        decay_start = max(config.warmup_steps, total_steps - decay_steps)
        progress = min(1.0, max(0, step - decay_start) / max(1, total_steps - decay_start))
        return 1.0 - (1.0 - floor) * progress
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, config: OptimConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, total_steps, config))
