"""Block-scaled low-precision number formats, emulated in PyTorch: FP8 (e4m3) and NVFP4 (e2m1).

`fake_quantize(x, block, fmt)` rounds x to what the format stores and returns it dequantized in fp32:
x is cut into tiles of `block` = (rows, cols) over its last two dimensions; each tile gets one scale
so that its largest magnitude maps to the format's largest value; values are divided by the scale,
rounded to the format, and multiplied back.

| format | values        | activation, gradient tiles | weight blocks | scales                           |
| ------ | ------------- | -------------------------- | ------------- | -------------------------------- |
| fp8    | e4m3, max 448 | 1 x 128                    | 128 x 128     | fp32 (DeepSeek-V3 sec. 3.3)      |
| nvfp4  | e2m1, max 6   | 1 x 16                     | 16 x 16       | e4m3 per block, fp32 per tensor  |

Emulation rounds exactly as the hardware formats do (round to nearest, saturating at the maximum);
what it does not reproduce is the GEMM's internal accumulation order, which here is full fp32. FP8
goes through the kernels room's blockwise quantiser and its inverse (`quantize_fp8_blockwise`: the
Triton kernel on a GPU, bit-for-bit its reference on CPU); NVFP4 through the generic tiling below.
NVFP4 training on Blackwell also uses stochastic rounding for gradients and random Hadamard
transforms before weight-gradient GEMMs; the emulation rounds to nearest throughout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moe_dag.kernels import dequantize_fp8_blockwise, quantize_fp8_blockwise

E4M3_MAX = 448.0
E2M1_MAX = 6.0


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (with sign), saturating at 6."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=x.device)
    index = torch.bucketize(x.abs().clamp(max=E2M1_MAX), (grid[1:] + grid[:-1]) / 2)
    return grid[index] * x.sign()


def _nvfp4_scales(amax: torch.Tensor, tensor_amax: torch.Tensor) -> torch.Tensor:
    # Two levels: an fp32 scale per tensor brings the block scales into e4m3's range, and each
    # block's scale is stored in e4m3.
    tensor_scale = (tensor_amax / (E2M1_MAX * E4M3_MAX)).clamp_min(torch.finfo(torch.float32).tiny)
    return round_to_e4m3(amax / E2M1_MAX / tensor_scale) * tensor_scale


def round_trip_tiles(
    x: torch.Tensor,
    block: tuple[int, int],
    round_values: Callable[[torch.Tensor], torch.Tensor],
    scales: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """x through a block format in fp32: per `block` tile of the last two dims, scale = scales(tile
    amax, tensor amax), values rounded by `round_values` in units of the scale."""
    rows, cols = block
    x32 = x.float() if x.ndim >= 2 else x.float()[None]
    *lead, R, C = x32.shape
    padded = F.pad(x32, (0, -C % cols, 0, -R % rows))
    Rp, Cp = padded.shape[-2:]
    tiles = padded.reshape(*lead, Rp // rows, rows, Cp // cols, cols)
    amax = tiles.abs().amax(dim=(-3, -1), keepdim=True)
    scale = scales(amax, x32.abs().amax())
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    dequantized = round_values(tiles / scale) * scale
    return dequantized.reshape(*lead, Rp, Cp)[..., :R, :C].reshape(x.shape)


def round_trip_fp8(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """x through e4m3 with one fp32 scale (amax / 448) per block, by the kernels room's quantiser."""
    q, scale = quantize_fp8_blockwise(x, block)
    return dequantize_fp8_blockwise(q, scale, block, torch.float32)


@dataclass(frozen=True, slots=True)
class BlockFormat:
    name: str
    activation_block: tuple[int, int]
    weight_block: tuple[int, int]
    round_trip: Callable[[torch.Tensor, tuple[int, int]], torch.Tensor]  # (x, block) -> x rounded, fp32


FP8 = BlockFormat(
    name="fp8",
    activation_block=(1, 128),
    weight_block=(128, 128),
    round_trip=round_trip_fp8,
)
NVFP4 = BlockFormat(
    name="nvfp4",
    activation_block=(1, 16),
    weight_block=(16, 16),
    round_trip=functools.partial(round_trip_tiles, round_values=round_to_e2m1, scales=_nvfp4_scales),
)


def fake_quantize(x: torch.Tensor, block: tuple[int, int], fmt: BlockFormat) -> torch.Tensor:
    """x rounded through `fmt` with one scale per `block` tile of its last two dims, in fp32."""
    return fmt.round_trip(x, block)
