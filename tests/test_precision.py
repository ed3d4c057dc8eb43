"""Precision recipes: block-scaled FP8 and NVFP4 rounding, the emulated layers against bf16, training
under each recipe, and the Transformer Engine path's error without the `gpu` extra.

Stated tolerances (the emulated formats against bf16, which has 8 mantissa bits to e4m3's 4):
- one linear layer: relative error of the output within 10% of bf16's own error scale, i.e.
  ||y_fp8 - y_fp32|| / ||y_fp32|| < 0.05 where bf16 sits near 0.005;
- 50 demo steps: final loss (mean of the last 5) within 0.05 of the bf16 run's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from moe_dag.training.config import PrecisionConfig, preset
from moe_dag.training.grouped_mm import looped_grouped_mm
from moe_dag.training.model import build_model
from moe_dag.training.precision import build_recipe
from moe_dag.training.precision.emulated import QuantizedLinear, quantized_grouped_mm, quantized_linear
from moe_dag.training.precision.formats import FP8, NVFP4, fake_quantize, round_to_e2m1
from moe_dag.training.synthetic import train_on_synthetic


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_fp8_tiles_share_one_scale_and_round_to_e4m3() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 300)
    x[0, :128] *= 1000  # a loud tile must not crush the next tile's precision
    q = fake_quantize(x, (1, 128), FP8)
    for row in range(3):
        for start in (0, 128, 256):
            tile, tile_q = x[row, start : start + 128], q[row, start : start + 128]
            scale = tile.abs().max() / 448
            codes = tile_q / scale
            torch.testing.assert_close(codes, codes.to(torch.float8_e4m3fn).float())  # representable
            assert tile_q.abs().max() == pytest.approx(tile.abs().max().item(), rel=1e-6)
            assert relative_error(tile_q, tile) < 0.04  # e4m3 keeps 3 mantissa bits
    weight = torch.randn(256, 256)
    assert relative_error(fake_quantize(weight, (128, 128), FP8), weight) < 0.04


def test_nvfp4_rounds_to_the_e2m1_grid_with_16_wide_blocks() -> None:
    assert round_to_e2m1(torch.tensor([0.2, 0.3, 1.2, 2.6, 5.1, 9.0, -4.4])).tolist() == [
        0.0,
        0.5,
        1.0,
        3.0,
        6.0,
        6.0,
        -4.0,
    ]
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    q = fake_quantize(x, (1, 16), NVFP4)
    distinct_per_block = [q[r, c : c + 16].abs().unique().numel() for r in range(4) for c in range(0, 64, 16)]
    assert max(distinct_per_block) <= 8  # at most the 8 magnitudes of e2m1
    assert 0.05 < relative_error(q, x) < 0.2


def test_emulated_fp8_linear_is_within_tolerance_of_bf16_and_quantizes_gradients() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(192, 256, requires_grad=True) / 16
    exact = x @ w.T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = F.linear(x, w)
        fp8 = quantized_linear(x, w, FP8)
    assert fp8.dtype == torch.bfloat16
    assert relative_error(bf16, exact) < 0.01
    assert relative_error(fp8, exact) < 0.05
    upstream = torch.randn_like(exact)
    grad_x, grad_w = torch.autograd.grad(quantized_linear(x, w, FP8), (x, w), upstream)
    exact_grad_x, exact_grad_w = upstream @ w, upstream.T @ x
    assert 0 < relative_error(grad_x, exact_grad_x) < 0.06  # rounded operands, not the exact grads
    assert 0 < relative_error(grad_w, exact_grad_w) < 0.06


def test_emulated_grouped_experts_match_the_quantized_per_expert_loop() -> None:
    torch.manual_seed(0)
    counts_E = torch.tensor([40, 0, 90, 30])
    x_MK = torch.randn(160, 128)
    w_ENK = torch.randn(4, 256, 128) / 11
    grouped = quantized_grouped_mm(x_MK, w_ENK, counts_E, fmt=FP8)
    looped = looped_grouped_mm(
        fake_quantize(x_MK, (1, 128), FP8), fake_quantize(w_ENK, (128, 128), FP8), counts_E
    )
    torch.testing.assert_close(grouped, looped)
    assert relative_error(grouped, looped_grouped_mm(x_MK, w_ENK, counts_E)) < 0.05


def test_emulated_recipe_keeps_edge_layers_routers_and_parameter_names() -> None:
    config = preset("demo").model
    model = build_model(config)
    names = [name for name, _ in model.named_parameters()]
    build_recipe(PrecisionConfig(recipe="fp8-emulated")).prepare(model)
    assert [name for name, _ in model.named_parameters()] == names
    assert type(model.layers[0].attn.wq) is torch.nn.Linear  # first block stays bf16
    assert type(model.layers[-1].attn.wq) is torch.nn.Linear  # last block too
    assert isinstance(model.layers[1].attn.wq, QuantizedLinear)
    assert type(model.layers[1].ffn.router.gate) is torch.nn.Linear
    assert model.layers[1].ffn.experts.grouped_mm.keywords["fmt"] is FP8


def losses_under(recipe_name: str, steps: int) -> list[float]:
    config = preset("demo")
    config = dataclasses.replace(
        config,
        # The demo architecture over a 512-token vocabulary: the synthetic chain is learnt in 50 steps.
        model=dataclasses.replace(config.model, vocab_size=512, seq_len=64),
        precision=dataclasses.replace(config.precision, recipe=recipe_name),
        train=dataclasses.replace(config.train, batch_size=2, steps=steps),
    )
    return train_on_synthetic(config, steps)


@pytest.mark.slow
def test_fifty_demo_steps_in_fp8_emulated_stay_within_tolerance_of_bf16() -> None:
    bf16, fp8 = losses_under("bf16", 50), losses_under("fp8-emulated", 50)
    assert sum(bf16[-5:]) / 5 < bf16[0] - 0.3  # it learns
    assert abs(sum(fp8[-5:]) / 5 - sum(bf16[-5:]) / 5) < 0.05


def test_transformer_engine_recipes_name_the_gpu_extra_when_missing() -> None:
    pytest.importorskip("torch")
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Transformer Engine is installed")
    for recipe in ("fp8", "nvfp4"):
        with pytest.raises(ImportError, match="`gpu` extra"):
            build_recipe(PrecisionConfig(recipe=recipe))


def test_unknown_recipe_is_refused() -> None:
    with pytest.raises(ValueError, match="precision.recipe='fp6'"):
        build_recipe(PrecisionConfig(recipe="fp6"))  # type: ignore[arg-type]
