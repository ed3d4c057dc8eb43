"""RMSNorm: the Triton kernels, run by Triton's interpreter on CPU, against a float64 reference.

The kernels run in a child Python under TRITON_INTERPRET=1 (this file run as a script, see
`interpreted_kernels`); the assertions run here.
"""

import sys

import pytest
import torch
from interpreted_kernels import run_interpreted
from torch import nn

from moe_dag.kernels import backend, rmsnorm
from moe_dag.kernels.rmsnorm import TritonRMSNorm, rms_norm, rms_norm_reference, use_triton_rms_norm

EPS = 1e-6
# shape, x dtype, weight dtype, gains: leading dimensions of any rank, hidden sizes that are not powers of
# two, bf16 activations with float32 weights as under mixed precision, and one gain for every feature (the
# MoE's output norm), which `rms_norm` expands for the kernels.
CASES = {
    "fp32_3d_d96": ((3, 5, 96), torch.float32, torch.float32, 96),
    "fp32_2d_d64": ((7, 64), torch.float32, torch.float32, 64),
    "bf16_2d_d80": ((9, 80), torch.bfloat16, torch.bfloat16, 80),
    "bf16_x_fp32_weight_d48": ((2, 3, 48), torch.bfloat16, torch.float32, 48),
    "fp32_single_gain_d40": ((6, 40), torch.float32, torch.float32, 1),
}
# bf16 results are float32 maths cast once to bf16. Compiled Triton rounds that cast to nearest (half an
# ulp, 2^-8 relative), but the interpreter truncates (triton/runtime/interpreter.py, _convert_float), so
# the bound here is one ulp: 2^-7 relative.
TOLERANCES = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-5},
}


def run_kernels() -> dict[str, dict[str, torch.Tensor]]:
    """In the child: run every case forward and backward through the Triton op, then check the op."""
    assert backend.INTERPRETED, "the child must start with TRITON_INTERPRET=1"
    torch.manual_seed(0)
    cases = {}
    for name, (shape, x_dtype, weight_dtype, gains) in CASES.items():
        x = torch.randn(shape).to(x_dtype).requires_grad_()
        weight = (1 + 0.1 * torch.randn(gains)).to(weight_dtype).requires_grad_()
        dy = torch.randn(shape).to(x_dtype)
        y = rms_norm(x, weight, EPS)
        y.backward(dy)
        cases[name] = {"x": x.detach(), "weight": weight.detach(), "dy": dy, "y": y.detach()}
        cases[name] |= {"dx": x.grad, "dweight": weight.grad}
    # Schema, fake (meta) implementations and autograd registration, as torch.compile relies on them.
    x, weight = torch.randn(4, 24, requires_grad=True), torch.randn(24, requires_grad=True)
    torch.library.opcheck(torch.ops.moe_dag.rms_norm_forward.default, (x, weight, EPS))
    # The backward op is not differentiable itself (no double backward), so it gets plain tensors.
    dy, rstd = torch.randn(4, 24), torch.rand(4) + 0.5
    backward_args = (dy, x.detach(), weight.detach(), rstd)
    torch.library.opcheck(torch.ops.moe_dag.rms_norm_backward.default, backward_args)
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    return run_interpreted(__file__, tmp_path_factory.mktemp("rmsnorm"))


@pytest.mark.parametrize("name", CASES)
def test_triton_forward_and_gradients_match_float64(interpreted, name):
    case = interpreted[name]
    x = case["x"].double().requires_grad_()
    weight = case["weight"].double().requires_grad_()
    rms_norm_reference(x, weight, EPS).backward(case["dy"].double())
    expected = rms_norm_reference(x.detach(), weight.detach(), EPS)

    x_tol, weight_tol = TOLERANCES[case["x"].dtype], TOLERANCES[case["weight"].dtype]
    assert case["y"].dtype == case["x"].dtype and case["dweight"].dtype == case["weight"].dtype
    torch.testing.assert_close(case["y"].double(), expected, **x_tol)
    torch.testing.assert_close(case["dx"].double(), x.grad, **x_tol)
    torch.testing.assert_close(case["dweight"].double(), weight.grad, **weight_tol)


# One gain per feature, and one gain for all of them (the MoE's output norm), which torch's rms_norm takes
# expanded: autograd of the expand sums its gradient over the features.
@pytest.mark.parametrize("gains", [40, 1], ids=["per_feature", "single_gain"])
def test_reference_matches_torch_rms_norm_forward_and_gradients(gains):
    x = torch.randn(4, 6, 40, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(gains, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(4, 6, 40, dtype=torch.float64)
    expected = nn.functional.rms_norm(x, (40,), weight.expand(40), EPS)
    expected_dx, expected_dweight = torch.autograd.grad(expected, (x, weight), dy)

    got = rms_norm_reference(x, weight, EPS)
    dx, dweight = torch.autograd.grad(got, (x, weight), dy)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, expected_dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dweight, expected_dweight, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm_reference(x, w, EPS), (x[:1, :2], weight))


def test_reference_keeps_low_precision_inputs_dtype_and_computes_in_float32():
    x = torch.randn(8, 40, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(40, requires_grad=True)
    y = rms_norm_reference(x, weight, EPS)
    y.float().sum().backward()
    assert y.dtype == x.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32
    expected = nn.functional.rms_norm(x.detach().float(), (40,), weight.detach(), EPS)
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(backend.INTERPRETED, reason="TRITON_INTERPRET=1 routes CPU tensors to Triton")
def test_cpu_tensors_use_the_reference_when_not_interpreted():
    x, weight = torch.randn(3, 40), torch.randn(40)
    assert torch.equal(rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS))


def test_use_triton_rms_norm_swaps_only_weighted_last_dim_norms():
    model = nn.Sequential(nn.RMSNorm(8), nn.Linear(8, 8), nn.RMSNorm(8, elementwise_affine=False))
    x = torch.randn(2, 8)
    before, keys = model(x), list(model.state_dict())

    assert use_triton_rms_norm(model) == 1
    assert type(model[0]) is TritonRMSNorm and type(model[2]) is nn.RMSNorm
    assert list(model.state_dict()) == keys
    # nn.RMSNorm's eps=None means the dtype's machine epsilon; the swapped module must keep that.
    torch.testing.assert_close(model(x), before)


def test_rows_wider_than_the_kernels_take_are_a_value_error_in_the_op_and_the_reference_in_rms_norm():
    width = rmsnorm.MAX_HIDDEN_SIZE + 1
    x, weight = torch.randn(2, width), torch.ones(width)
    with pytest.raises(ValueError, match=f"hidden size up to {rmsnorm.MAX_HIDDEN_SIZE}, got {width}"):
        rmsnorm.rms_norm_forward(x, weight, EPS)
    assert torch.equal(rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS))


def test_weight_of_the_wrong_shape_is_a_value_error():
    with pytest.raises(ValueError, match=r"weight of shape \(D,\) or \(1,\).*\(3, 40\).*\(41,\)"):
        rms_norm(torch.randn(3, 40), torch.randn(41), EPS)
    with pytest.raises(ValueError, match=r"weight of shape \(D,\) with.*\(3, 40\).*\(1,\)"):
        rmsnorm.rms_norm_forward(torch.randn(3, 40), torch.randn(1), EPS)


if __name__ == "__main__":
    torch.save(run_kernels(), sys.argv[1])
