"""Optimizers: parameter groups, Muon's orthogonalisation and update size, decoupled decay, schedules."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from moe_dag.training.config import OptimConfig, tiny
from moe_dag.training.model import build_model
from moe_dag.training.optim import Muon, build_optimizer, lr_multiplier, newton_schulz, parameter_groups


def test_every_parameter_lands_in_exactly_one_named_group() -> None:
    config = dataclasses.replace(tiny().model, attention_pattern=("mla", "kda"))
    model = build_model(config)
    groups = parameter_groups(model)
    names = {id(p): name for name, p in model.named_parameters()}
    named = {group: {names[id(p)] for p in params} for group, params in groups.items()}
    assert named["embedding"] == {"tok_embeddings.weight"}
    assert named["head"] == {"output.weight"}
    assert named["router"] == {"layers.1.ffn.router.gate.weight"}
    assert {"layers.1.ffn.experts.w1_EFD", "layers.0.attn.wkv_b.weight", "layers.1.attn.wq.weight"} <= named[
        "matrices"
    ]
    assert {"norm.weight", "layers.1.ffn.output_norm_scale", "layers.1.attn.A_log_H"} <= named["scalars"]
    assert "layers.1.attn.conv_weight_3XW" in named["scalars"]  # a 3-D tensor that is not a matrix stack
    assert sum(len(v) for v in named.values()) == len(names)


def test_per_group_learning_rates_and_decay() -> None:
    config = OptimConfig(name="muon", lr=0.02, embedding_lr=0.3, head_lr=0.004, scalar_lr=0.1)
    optimizer = build_optimizer(build_model(tiny().model), config)
    by_name = {group["name"]: group for group in optimizer.param_groups}
    assert {name: group["lr"] for name, group in by_name.items()} == {
        "matrices": 0.02,
        "embedding": 0.3,
        "head": 0.004,
        "router": 0.02,
        "scalars": 0.1,
    }
    assert [name for name, group in by_name.items() if group["use_muon"]] == ["matrices"]
    assert by_name["embedding"]["weight_decay"] == by_name["scalars"]["weight_decay"] == 0.0
    assert by_name["matrices"]["weight_decay"] == by_name["head"]["weight_decay"] == 0.1


@pytest.mark.parametrize("shape", [(64, 32), (32, 96), (4, 48, 16)])
def test_newton_schulz_pushes_every_singular_value_near_one(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    # An ill-conditioned input: singular values spread over two orders of magnitude (five steps
    # leave values far below 1e-2 of the largest behind; Muon's gradients are not that skewed).
    g = torch.randn(shape) @ torch.diag(torch.logspace(0, -2, shape[-1]))
    singular = torch.linalg.svdvals(newton_schulz(g, steps=5))
    assert singular.min() > 0.5 and singular.max() < 1.3  # the quintic's band is about [0.7, 1.2]
    exact = torch.linalg.svd(g, full_matrices=False)
    u_vt = exact.U @ exact.Vh
    cosine = (newton_schulz(g) * u_vt).sum(dim=(-2, -1)) / (u_vt.norm(dim=(-2, -1)) ** 2)
    assert (cosine > 0.85).all()  # it points where U V^T points


def test_stacked_experts_are_orthogonalised_one_by_one() -> None:
    torch.manual_seed(0)
    g = torch.randn(3, 24, 8)
    g[1] *= 1000  # a loud expert must not change the quiet experts' updates
    batched = newton_schulz(g)
    for e in range(3):
        torch.testing.assert_close(batched[e], newton_schulz(g[e]), rtol=1e-4, atol=1e-5)


def test_muon_update_has_adamw_rms_and_decoupled_decay() -> None:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(128, 64))
    before = weight.detach().clone()
    optimizer = Muon([{"params": [weight], "use_muon": True, "weight_decay": 0.1}], lr=0.01, momentum=0.0)
    weight.grad = torch.randn(128, 64)
    optimizer.step()
    update = (before * (1 - 0.01 * 0.1) - weight.detach()) / 0.01
    rms = update.square().mean().sqrt().item()
    # 0.2 sqrt(max(A, B)) x an orthogonal-ish matrix of RMS about 1/sqrt(max(A, B)): about 0.2.
    assert rms == pytest.approx(0.2, rel=0.25)


def test_muon_adamw_groups_match_torch_adamw() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
    b.data.copy_(a.data)
    muon = Muon([{"params": [a], "use_muon": False, "weight_decay": 0.1}], lr=0.01, betas=(0.9, 0.95))
    adamw = torch.optim.AdamW([b], lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(5)
        a.grad, b.grad = grad.clone(), grad.clone()
        muon.step()
        adamw.step()
    torch.testing.assert_close(a, b)


def test_cosine_schedule_warms_up_then_decays_to_the_floor() -> None:
    config = OptimConfig(warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(0, 100, config) == pytest.approx(0.1)
    assert lr_multiplier(9, 100, config) == pytest.approx(1.0)
    assert lr_multiplier(55, 100, config) == pytest.approx(0.55)
    assert lr_multiplier(100, 100, config) == pytest.approx(0.1)


def test_warmup_stable_decay_holds_then_decays_linearly_at_the_end() -> None:
    config = OptimConfig(schedule="wsd", warmup_steps=10, decay_fraction=0.2, min_lr_ratio=0.0)
    values = [lr_multiplier(step, 100, config) for step in range(101)]
    assert values[4] == pytest.approx(0.5)
    assert all(v == 1.0 for v in values[10:81])
    assert values[90] == pytest.approx(0.5)
    assert values[100] == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(values[80:], values[81:], strict=False))
    assert not math.isnan(sum(values))
