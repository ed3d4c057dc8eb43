"""The Transformer Engine recipes' plumbing, on CPU, against a stand-in for TE's documented interface.

Transformer Engine needs an NVIDIA GPU, so these tests install a small fake `transformer_engine` that
implements the calls the recipe makes (te.Linear, te.GroupedLinear with weight<i> parameters and
m_splits, te.Fp8Padding / te.Fp8Unpadding, te.autocast, the recipe classes) in plain PyTorch, without
any quantization. They check what the recipe does around TE: which layers it converts, that weights
are copied, that expert rows are split and padded per expert, and which TE recipe each setting picks.
The numerics of FP8 itself are checked by the emulated recipe's tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import types

import pytest
import torch
from torch import nn

from moe_dag.training.config import PrecisionConfig, preset
from moe_dag.training.model import build_model
from moe_dag.training.precision import build_recipe
from moe_dag.training.precision.transformer_engine import TEGroupedExperts


class FakeLinear(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, params_dtype=None, device=None):
        super().__init__(in_features, out_features, bias=bias, dtype=params_dtype, device=device)


class FakeGroupedLinear(nn.Module):
    def __init__(self, num_gemms, in_features, out_features, bias=True, params_dtype=None, device=None):
        super().__init__()
        self.num_gemms = num_gemms
        for i in range(num_gemms):
            weight = torch.empty(out_features, in_features, dtype=params_dtype, device=device)
            self.register_parameter(f"weight{i}", nn.Parameter(weight))
        self.calls: list[list[int]] = []

    def forward(self, inp, m_splits):
        assert isinstance(m_splits, list) and len(m_splits) == self.num_gemms
        self.calls.append(m_splits)
        parts = inp.split(m_splits)
        return torch.cat([x @ getattr(self, f"weight{i}").T.to(x.dtype) for i, x in enumerate(parts)])


class FakePadding(nn.Module):
    def __init__(self, num_gemms, align_size=None):
        super().__init__()
        self.align = align_size or 16

    def forward(self, inp, m_splits):
        padded = [(m + self.align - 1) // self.align * self.align for m in m_splits]
        parts = [
            torch.nn.functional.pad(x, (0, 0, 0, p - m))
            for x, m, p in zip(inp.split(m_splits), m_splits, padded, strict=True)
        ]
        return torch.cat(parts), padded


class FakeUnpadding(nn.Module):
    def __init__(self, num_gemms, align_size=None):
        super().__init__()
        self.align = align_size or 16

    def forward(self, inp, m_splits):
        padded = [(m + self.align - 1) // self.align * self.align for m in m_splits]
        return torch.cat([x[:m] for x, m in zip(inp.split(padded), m_splits, strict=True)])


@pytest.fixture
def fake_te(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    recipes = types.SimpleNamespace(
        Format=types.SimpleNamespace(HYBRID="HYBRID", E4M3="E4M3"),
        DelayedScaling=lambda **kw: ("delayed", kw),
        Float8CurrentScaling=lambda **kw: ("current", kw),
        Float8BlockScaling=lambda **kw: ("block", kw),
        NVFP4BlockScaling=lambda **kw: ("nvfp4", kw),
    )
    entered: list[object] = []

    @contextlib.contextmanager
    def autocast(enabled=True, recipe=None):
        entered.append(recipe)
        yield

    te = types.SimpleNamespace(
        Linear=FakeLinear,
        GroupedLinear=FakeGroupedLinear,
        Fp8Padding=FakePadding,
        Fp8Unpadding=FakeUnpadding,
        autocast=autocast,
        entered=entered,
    )
    package = types.ModuleType("transformer_engine")
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.__dict__.update(vars(te))
    common = types.ModuleType("transformer_engine.common")
    recipe_module = types.ModuleType("transformer_engine.common.recipe")
    recipe_module.__dict__.update(vars(recipes))
    package.pytorch, package.common, common.recipe = pytorch, common, recipe_module
    for name, module in (
        ("transformer_engine", package),
        ("transformer_engine.pytorch", pytorch),
        ("transformer_engine.common", common),
        ("transformer_engine.common.recipe", recipe_module),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return te


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"fp8_scaling": "delayed"}, "delayed"),
        ({"fp8_scaling": "current"}, "current"),
        ({}, "block"),
        ({"recipe": "nvfp4"}, "nvfp4"),
    ],
)
def test_each_setting_picks_its_te_recipe(fake_te, settings: dict, expected: str) -> None:
    config = PrecisionConfig(**{"recipe": "fp8", **settings})
    recipe = build_recipe(config)
    with recipe.autocast(torch.device("cpu")):
        pass
    assert fake_te.entered[-1][0] == expected


def test_conversion_keeps_the_function_and_splits_experts_per_group(fake_te) -> None:
    config = dataclasses.replace(preset("demo").model, vocab_size=256, seq_len=32)
    torch.manual_seed(0)
    model = build_model(config)
    reference = build_model(config)
    reference.load_state_dict(model.state_dict())
    recipe = build_recipe(PrecisionConfig(recipe="fp8"))
    recipe.prepare(model)
    assert isinstance(model.layers[1].attn.wq, FakeLinear)
    assert type(model.layers[0].attn.wq) is nn.Linear and type(model.layers[-1].attn.wq) is nn.Linear
    assert type(model.layers[1].ffn.router.gate) is nn.Linear
    experts = model.layers[1].ffn.experts
    assert isinstance(experts, TEGroupedExperts)
    tokens = torch.randint(0, 256, (2, 32))
    with torch.no_grad(), recipe.autocast(torch.device("cpu")):
        converted = model(tokens)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(tokens)
    torch.testing.assert_close(converted, expected, rtol=0.05, atol=0.05)
    splits = experts.w13.calls[-1]
    assert len(splits) == config.num_experts and all(m % 16 == 0 for m in splits)  # padded per expert
