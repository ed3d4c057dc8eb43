"""Blockwise FP8 quantisation: the Triton kernels, run by Triton's interpreter, against the references.

The kernels run in a child Python under TRITON_INTERPRET=1 (this file run as a script, see
`interpreted_kernels`); the assertions run here.
"""

import sys

import pytest
import torch
import triton
from interpreted_kernels import run_interpreted

from moe_dag.kernels import backend, fp8
from moe_dag.kernels.fp8 import (
    ACTIVATION_BLOCK,
    FP8_DTYPE,
    FP8_MAX,
    WEIGHT_BLOCK,
    dequantize_fp8_blockwise,
    dequantize_fp8_blockwise_reference,
    quantize_fp8_blockwise,
    quantize_fp8_blockwise_reference,
)

# shape, block, dtype: edges that are not whole blocks, a batch of weight blocks (experts), a 1-D
# tensor, and bf16 / fp16 inputs.
CASES = {
    "act_5x300_fp32": ((5, 300), ACTIVATION_BLOCK, torch.float32),
    "act_2x3x256_fp16": ((2, 3, 256), ACTIVATION_BLOCK, torch.float16),
    "act_1d_257_fp32": ((257,), ACTIVATION_BLOCK, torch.float32),
    "weight_2x130x200_bf16": ((2, 130, 200), WEIGHT_BLOCK, torch.bfloat16),
}


def sample(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Columns spanning nine decades, so blocks hold e4m3 subnormals and values that flush to zero, and
    an all-zero first block."""
    x = torch.randn(shape) * torch.logspace(-6, 3, shape[-1])
    first_block = (slice(None, 128),) if len(shape) == 1 else (..., 0, slice(None, 128))
    x[first_block] = 0.0
    return x.to(dtype)


def run_kernels() -> dict[str, dict[str, torch.Tensor]]:
    assert backend.INTERPRETED, "the child must start with TRITON_INTERPRET=1"
    torch.manual_seed(0)
    cases = {}
    for name, (shape, block, dtype) in CASES.items():
        x = sample(shape, dtype)
        q, scale = quantize_fp8_blockwise(x, block)
        cases[name] = {
            "x": x,
            "q": q,
            "scale": scale,
            "x_back": dequantize_fp8_blockwise(q, scale, block, dtype),
        }
    x = torch.randn(3, 130)
    torch.library.opcheck(torch.ops.moe_dag.quantize_fp8_blockwise.default, (x, 1, 128))
    q, scale = quantize_fp8_blockwise(x)
    # opcheck's schema test perturbs inputs with arithmetic that CPU float8 tensors do not implement.
    dequantize_args = (q, scale, 1, 128, torch.bfloat16)
    dequantize_checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.moe_dag.dequantize_fp8_blockwise.default, dequantize_args, test_utils=dequantize_checks
    )
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    return run_interpreted(__file__, tmp_path_factory.mktemp("fp8"))


@pytest.mark.parametrize("name", CASES)
def test_triton_quantisation_is_bit_for_bit_the_reference(interpreted, name):
    case, block = interpreted[name], CASES[name][1]
    q, scale = quantize_fp8_blockwise_reference(case["x"], block)
    assert case["q"].dtype == FP8_DTYPE and case["scale"].dtype == torch.float32
    assert torch.equal(case["scale"], scale)
    assert torch.equal(case["q"].view(torch.uint8), q.view(torch.uint8))
    x_back = dequantize_fp8_blockwise_reference(q, scale, block, case["x"].dtype)
    if case["x"].dtype == torch.bfloat16:  # the interpreter truncates float32 to bf16: one ulp
        torch.testing.assert_close(case["x_back"], x_back, rtol=2**-7, atol=0)
    else:
        assert torch.equal(case["x_back"], x_back)


def test_scales_and_shapes_per_block():
    x = torch.zeros(3, 260, 300)
    x[1, 129, 257] = -896.0  # row block 1, column block 2 of expert 1
    q, scale = quantize_fp8_blockwise_reference(x, WEIGHT_BLOCK)
    assert q.shape == x.shape and scale.shape == (3, 3, 3)
    assert scale[1, 1, 2] == 2.0 and q[1, 129, 257].float() == -FP8_MAX
    assert (scale.flatten().tolist().count(1.0)) == 26  # every all-zero block keeps scale 1


def test_rounding_is_to_nearest_with_ties_to_even():
    # With amax 448 the scale is 1, so values are e4m3 steps directly: spacing 1 in [8, 16), 2^-9 for
    # subnormals. 8.5 and 10.5 are ties (to 8 and 10), 9.5 rounds up to 10, 3 * 2^-10 is a subnormal tie.
    x = torch.tensor([448.0, 8.5, 9.5, 10.5, 8.4, 3 * 2.0**-10, 2.0**-9, -8.5])
    q, scale = quantize_fp8_blockwise_reference(x)
    assert scale.tolist() == [1.0]
    assert q.float().tolist() == [448.0, 8.0, 10.0, 10.0, 8.0, 2 * 2.0**-9, 2.0**-9, -8.0]


def test_round_trip_error_is_within_half_an_e4m3_step():
    x = torch.randn(64, 512)
    q, scale = quantize_fp8_blockwise_reference(x)
    x_back = dequantize_fp8_blockwise_reference(q, scale, ACTIVATION_BLOCK, torch.float32)
    # 3 mantissa bits: relative spacing at most 2^-3, so nearest rounding errs by at most 2^-4, plus
    # the subnormal floor: 2^-10 of the scale.
    bound = 2.0**-4 * x.abs() + 2.0**-10 * scale.repeat_interleave(128, dim=1)
    assert ((x_back - x).abs() <= bound).all()


@pytest.mark.skipif(backend.INTERPRETED, reason="TRITON_INTERPRET=1 routes CPU tensors to Triton")
def test_cpu_tensors_use_the_reference_when_not_interpreted():
    x = torch.randn(4, 256)
    q, scale = quantize_fp8_blockwise(x)
    assert torch.equal(q.view(torch.uint8), quantize_fp8_blockwise_reference(x)[0].view(torch.uint8))
    assert torch.equal(dequantize_fp8_blockwise(q, scale), dequantize_fp8_blockwise_reference(q, scale))


def test_gpu_autotuning_keeps_tiles_that_fit_in_registers():
    configs = [triton.Config({"ROW_GROUPS": g}) for g in (1, 4, 16, 32)]
    weight_configs = fp8._tiles_that_fit(configs, {}, BLOCK_R=128, BLOCK_C=128)
    activation_configs = fp8._tiles_that_fit(configs, {}, BLOCK_R=1, BLOCK_C=128)
    assert [c.kwargs["ROW_GROUPS"] for c in weight_configs] == [1]
    assert activation_configs == configs
    # A block larger than any tile still gets the smallest config rather than none.
    assert [c.kwargs["ROW_GROUPS"] for c in fp8._tiles_that_fit(configs, {}, BLOCK_R=256, BLOCK_C=128)] == [1]


def test_bad_blocks_and_scales_are_value_errors():
    with pytest.raises(ValueError, match=r"each a power of two, got \(1, 100\)"):
        quantize_fp8_blockwise(torch.randn(4, 256), (1, 100))
    q, scale = quantize_fp8_blockwise_reference(torch.randn(4, 256))
    with pytest.raises(
        ValueError, match=r"scales of shape \(1, 2\) expected .* blocks of \(128, 128\), got \(4, 2\)"
    ):
        dequantize_fp8_blockwise(q, scale, WEIGHT_BLOCK)
    with pytest.raises(ValueError, match="float8_e4m3fn values and float32 scales"):
        dequantize_fp8_blockwise(q.float(), scale)


if __name__ == "__main__":
    torch.save(run_kernels(), sys.argv[1])
