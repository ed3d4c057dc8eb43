"""Grouped GEMM: the Triton kernels, run by Triton's interpreter on CPU, against the per-expert loop
reference in float64 and against torch._grouped_mm.

The kernels run in a child Python under TRITON_INTERPRET=1 (this file run as a script, see
`interpreted_kernels`); the assertions run here.
"""

import sys

import pytest
import torch
from interpreted_kernels import run_interpreted

from moe_dag.kernels import backend
from moe_dag.kernels.fp8 import WEIGHT_BLOCK, quantize_fp8_blockwise
from moe_dag.kernels.grouped_gemm import (
    grouped_mm,
    grouped_mm_fp8,
    grouped_mm_fp8_reference,
    grouped_mm_reference,
)

# rows per expert, D, F, dtype, whether w is the transpose of a stored (E, F, D) weight (as the model
# passes it): empty experts first, in the middle and last, row counts and widths that are not whole
# tiles. Widths are multiples of 16 bytes, which torch._grouped_mm needs.
CASES = {
    "fp32_transposed_w": ([20, 0, 25, 5], 40, 72, torch.float32, True),
    "bf16_empty_first_and_last": ([0, 30, 0], 48, 40, torch.bfloat16, False),
    "fp32_one_expert": ([17], 32, 24, torch.float32, False),
}
TOLERANCES = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    # float32 accumulation cast once to bf16; the interpreter truncates that cast: one ulp.
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-4},
}
FP8_COUNTS, FP8_D, FP8_F = [10, 0, 30], 200, 150


def offsets_of(counts: list[int]) -> torch.Tensor:
    return torch.tensor(counts).cumsum(0).to(torch.int32)


def weights(E: int, D: int, F: int, dtype: torch.dtype, transposed: bool) -> torch.Tensor:
    """w_EDF as a leaf tensor, or (transposed) the leaf w_EFD whose transpose is w_EDF."""
    return (torch.randn(E, F, D) if transposed else torch.randn(E, D, F)).to(dtype).requires_grad_()


def as_EDF(w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return w.transpose(1, 2) if transposed else w


def run_kernels() -> dict[str, dict[str, torch.Tensor]]:
    assert backend.INTERPRETED, "the child must start with TRITON_INTERPRET=1"
    torch.manual_seed(0)
    cases = {}
    for name, (counts, D, F, dtype, transposed) in CASES.items():
        x = torch.randn(sum(counts), D).to(dtype).requires_grad_()
        w = weights(len(counts), D, F, dtype, transposed)
        y = grouped_mm(x, as_EDF(w, transposed), offsets_of(counts))
        dy = torch.randn_like(y)
        y.backward(dy)
        cases[name] = {
            "x": x.detach(),
            "w": w.detach(),
            "dy": dy,
            "y": y.detach(),
            "dx": x.grad,
            "dw": w.grad,
        }

    x, w_EFD = torch.randn(sum(FP8_COUNTS), FP8_D), torch.randn(len(FP8_COUNTS), FP8_F, FP8_D)
    xq, x_scale = quantize_fp8_blockwise(x)
    wq, w_scale = quantize_fp8_blockwise(w_EFD, WEIGHT_BLOCK)
    fp8_args = (xq, x_scale, wq.transpose(1, 2), w_scale.transpose(1, 2), offsets_of(FP8_COUNTS))
    cases["fp8"] = {"args": fp8_args, "y": grouped_mm_fp8(*fp8_args, out_dtype=torch.float32)}

    offsets = offsets_of([3, 0, 5])
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(3, 16, 24, requires_grad=True)
    torch.library.opcheck(torch.ops.moe_dag.grouped_mm.default, (x, w, offsets))
    weight_grad_args = (x.detach(), torch.randn(8, 24), offsets, w.detach())
    torch.library.opcheck(torch.ops.moe_dag.grouped_mm_weight_grad.default, weight_grad_args)
    # opcheck's schema test perturbs inputs with arithmetic that CPU float8 tensors do not implement.
    fp8_checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.moe_dag.grouped_mm_fp8.default, (*fp8_args, torch.bfloat16), test_utils=fp8_checks
    )
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    return run_interpreted(__file__, tmp_path_factory.mktemp("grouped_gemm"))


@pytest.mark.parametrize("name", CASES)
def test_triton_grouped_mm_forward_and_gradients_match_float64_loop(interpreted, name):
    case, (counts, _, _, dtype, transposed) = interpreted[name], CASES[name]
    x = case["x"].double().requires_grad_()
    w = case["w"].double().requires_grad_()
    y = grouped_mm_reference(x, as_EDF(w, transposed), offsets_of(counts))
    y.backward(case["dy"].double())

    assert case["y"].dtype == dtype and case["dw"].shape == case["w"].shape
    torch.testing.assert_close(case["y"].double(), y.detach(), **TOLERANCES[dtype])
    torch.testing.assert_close(case["dx"].double(), x.grad, **TOLERANCES[dtype])
    torch.testing.assert_close(case["dw"].double(), w.grad, **TOLERANCES[dtype])


@pytest.mark.parametrize("name", CASES)
def test_triton_grouped_mm_matches_torch_grouped_mm(interpreted, name):
    case, (counts, _, _, dtype, transposed) = interpreted[name], CASES[name]
    expected = torch._grouped_mm(case["x"], as_EDF(case["w"], transposed), offs=offsets_of(counts))
    torch.testing.assert_close(case["y"], expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_grouped_mm_takes_the_same_offsets_as_the_loop_reference(dtype):
    # torch._grouped_mm's offsets are cumulative int32 ends, one per group, as grouped_mm takes them.
    counts, offsets = [4, 0, 12], offsets_of([4, 0, 12])
    x = torch.randn(sum(counts), 32).to(dtype).requires_grad_()
    w = torch.randn(3, 32, 16).to(dtype).requires_grad_()
    dy = torch.randn(sum(counts), 16).to(dtype)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch._grouped_mm(x, w, offs=offsets).backward(dy)
    grouped_mm_reference(x64, w64, offsets).backward(dy.double())
    tolerance = {"rtol": 2**-8, "atol": 1e-3} if dtype == torch.bfloat16 else TOLERANCES[dtype]
    torch.testing.assert_close(x.grad.double(), x64.grad, **tolerance)
    torch.testing.assert_close(w.grad.double(), w64.grad, **tolerance)
    assert (w.grad[1] == 0).all()  # the expert without rows gets no gradient


def test_triton_fp8_grouped_mm_matches_dequantised_reference(interpreted):
    case = interpreted["fp8"]
    expected = grouped_mm_fp8_reference(*case["args"], out_dtype=torch.float32)
    torch.testing.assert_close(case["y"], expected, rtol=1e-5, atol=1e-4)
    assert (case["y"][FP8_COUNTS[0] :].abs().sum(1) > 0).all()  # expert 1 had no rows; expert 2 got them


def test_fp8_grouped_mm_stays_close_to_the_unquantised_product():
    x, w_EFD = torch.randn(24, 256), torch.randn(2, 128, 256)
    offsets = offsets_of([8, 16])
    xq, x_scale = quantize_fp8_blockwise(x)
    wq, w_scale = quantize_fp8_blockwise(w_EFD, WEIGHT_BLOCK)
    y = grouped_mm_fp8_reference(
        xq, x_scale, wq.transpose(1, 2), w_scale.transpose(1, 2), offsets, torch.float32
    )
    exact = grouped_mm_reference(x, w_EFD.transpose(1, 2), offsets)
    # Each operand is off by at most 2^-4 relative; over 256 random products the error averages out.
    assert ((y - exact).norm() / exact.norm()).item() < 0.05


@pytest.mark.skipif(backend.INTERPRETED, reason="TRITON_INTERPRET=1 routes CPU tensors to Triton")
def test_cpu_tensors_use_the_reference_when_not_interpreted():
    x, w, offsets = torch.randn(6, 8), torch.randn(2, 8, 4), offsets_of([2, 4])
    assert torch.equal(grouped_mm(x, w, offsets), grouped_mm_reference(x, w, offsets))


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        (torch.tensor([4, 2, 6], dtype=torch.int32), r"offsets must rise from 0 to M=6, got \[4, 2, 6\]"),
        (torch.tensor([2, 4, 5], dtype=torch.int32), r"offsets must rise from 0 to M=6, got \[2, 4, 5\]"),
        (
            torch.tensor([2, 4, 6]),
            r"int32 offsets of shape \(3,\), one cumulative end per expert, got torch.int64",
        ),
        (torch.tensor([2, 6], dtype=torch.int32), r"int32 offsets of shape \(3,\)"),
    ],
)
def test_bad_offsets_are_value_errors(offsets, message):
    with pytest.raises(ValueError, match=message):
        grouped_mm_reference(torch.randn(6, 8), torch.randn(3, 8, 4), offsets)


def test_mismatched_widths_are_a_value_error():
    with pytest.raises(ValueError, match=r"x of shape \(M, D\) and w of shape \(E, D, F\), got x \(6, 8\)"):
        grouped_mm(torch.randn(6, 8), torch.randn(3, 9, 4), offsets_of([2, 2, 2]))


if __name__ == "__main__":
    torch.save(run_kernels(), sys.argv[1])
