"""Blockwise FP8 quantisation (e4m3, float32 scales) and its inverse: Triton kernels beside the references.

The DeepSeek-V3 recipe (arXiv:2412.19437, sec. 3.3.2): activations get one scale per 1x128 tile along
the hidden dimension, weights one per 128x128 block, so a single outlier only coarsens its own block.
Per block,

    scale = amax(|x|) / 448          (448: the largest finite e4m3 value; 1.0 for an all-zero block)
    q     = e4m3(clamp(x / scale, -448, 448)),  rounded to nearest, ties to even
    x    ~= q * scale

Blocks tile the last two dimensions of x (leading dimensions, such as experts, are a batch); a block at
the edge covers what is left. The kernel rounds to the e4m3 grid in float32 arithmetic before it casts,
so the cast itself is exact: the result is bit-for-bit torch's `.to(torch.float8_e4m3fn)` compiled or
interpreted (Triton's interpreter mis-rounds fp8 casts that carry into the exponent), and the divisions
are IEEE (`div_rn`), as torch's are, rather than the GPU's faster approximate ones.

Shape legend: B batch (every dimension before the last two, flattened), R rows, C columns (the last
dimension), Rb and Cb blocks along them (scale shape (..., Rb, Cb)), G blocks of rows per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_dag.kernels.backend import autotune_configs, fp8_triton_runs_on

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
ACTIVATION_BLOCK = (1, 128)
WEIGHT_BLOCK = (128, 128)
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _as_batch_rows_cols(shape: torch.Size) -> tuple[int, int, int]:
    """(B, R, C) for a tensor whose last two dimensions are tiled; a 1-D tensor is a single row."""
    if len(shape) == 1:
        return 1, 1, shape[0]
    batch = 1
    for size in shape[:-2]:
        batch *= size
    return batch, shape[-2], shape[-1]


def scale_shape(shape: torch.Size, block: tuple[int, int]) -> torch.Size:
    """Shape of the scales for a tensor of `shape` quantised in blocks of `block` (rows, columns)."""
    if len(shape) == 1:
        return torch.Size([triton.cdiv(shape[0], block[1])])
    rows, cols = shape[-2:]
    return torch.Size([*shape[:-2], triton.cdiv(rows, block[0]), triton.cdiv(cols, block[1])])


def _check_block(block: tuple[int, int]) -> None:
    if len(block) != 2 or any(size < 1 or size & (size - 1) for size in block):
        raise ValueError(f"FP8 blocks are (rows, columns), each a power of two, got {block}")


def _check_quantized(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> None:
    _check_block(block)
    if q.dtype != FP8_DTYPE or scale.dtype != torch.float32:
        raise ValueError(
            f"dequantize needs {FP8_DTYPE} values and float32 scales, got {q.dtype}, {scale.dtype}"
        )
    if scale.shape != scale_shape(q.shape, block):
        raise ValueError(
            f"scales of shape {tuple(scale_shape(q.shape, block))} expected for values {tuple(q.shape)} in "
            f"blocks of {block}, got {tuple(scale.shape)}"
        )


def _blocks_view(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Size]:
    """x padded with zeros to whole blocks, viewed as (B, Rb, rows per block, Cb, columns per block)."""
    B, R, C = _as_batch_rows_cols(x.shape)
    Rb, Cb = triton.cdiv(R, block[0]), triton.cdiv(C, block[1])
    padded = torch.nn.functional.pad(x.reshape(B, R, C), (0, Cb * block[1] - C, 0, Rb * block[0] - R))
    return padded.view(B, Rb, block[0], Cb, block[1]), torch.Size([B, Rb * block[0], Cb * block[1]])


def quantize_fp8_blockwise_reference(
    x: torch.Tensor, block: tuple[int, int] = ACTIVATION_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch: (q in float8_e4m3fn, shape of x; scale float32, `scale_shape(x.shape, block)`)."""
    _check_block(block)
    B, R, C = _as_batch_rows_cols(x.shape)
    blocks, padded_shape = _blocks_view(x.float(), block)
    amax = blocks.abs().amax(dim=(2, 4), keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(padded_shape)[:, :R, :C]
    return q.reshape(x.shape), scale.reshape(scale_shape(x.shape, block))


def dequantize_fp8_blockwise_reference(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = ACTIVATION_BLOCK,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # fmt: skip
    """Plain PyTorch: q * scale (each block's scale), in `dtype`."""
    _check_quantized(q, scale, block)
    B, R, C = _as_batch_rows_cols(q.shape)
    blocks, padded_shape = _blocks_view(q.float(), block)
    Rb, Cb = blocks.shape[1], blocks.shape[3]
    x = (blocks * scale.reshape(B, Rb, 1, Cb, 1)).view(padded_shape)[:, :R, :C]
    return x.reshape(q.shape).to(dtype)


@triton.jit
def _round_to_e4m3_grid(v):
    """v (float32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, still in float32.

    e4m3 has 3 mantissa bits: in the binade [2^e, 2^(e+1)) its values are 2^(e-3) apart, and below the
    smallest normal (2^-6) the subnormals keep that binade's spacing, 2^-9. So v / spacing is a count of
    steps (< 16, exact: division by a power of two), which floor(steps + 0.5) rounds, ties to even fixed.
    """
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)
    spacing = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    steps = tl.abs(v) / spacing
    nearest = tl.floor(steps + 0.5)
    odd = nearest - 2.0 * tl.floor(nearest * 0.5)
    nearest = tl.where((nearest - steps == 0.5) & (odd == 1.0), nearest - 1.0, nearest)
    return tl.where(v < 0, -nearest, nearest) * spacing


_QUANTIZE_CONFIGS = autotune_configs(
    [triton.Config({"ROW_GROUPS": g}, num_warps=w) for g in (1, 4, 16, 32) for w in (4, 8)],
    interpreted=triton.Config({"ROW_GROUPS": 4}),
)
# A program's tile stays within this many values (64 KiB of float32 across its warps), so 1x128
# activation tiles stack up to 32 to a program and 128x128 weight blocks go one to a program.
MAX_TILE_VALUES = 16384


def _tiles_that_fit(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    block_values = kwargs["BLOCK_R"] * kwargs["BLOCK_C"]
    fitting = [c for c in configs if c.kwargs["ROW_GROUPS"] * block_values <= MAX_TILE_VALUES]
    return fitting or [min(configs, key=lambda c: c.kwargs["ROW_GROUPS"])]


_autotune = triton.autotune(
    configs=_QUANTIZE_CONFIGS,
    key=["C", "BLOCK_R", "BLOCK_C"],
    prune_configs_by={"early_config_prune": _tiles_that_fit},
)


@triton.jit
def _program_tile(R, C, Rb, Cb, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ROW_GROUPS: tl.constexpr):
    """This program's tile of a (B, R, C) tensor: ROW_GROUPS blocks stacked along the rows, one block
    wide. Returns offsets and mask of its values, and offsets and mask of its ROW_GROUPS scales."""
    row_block0 = tl.program_id(0) * ROW_GROUPS
    col_block = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    rows = row_block0 * BLOCK_R + tl.arange(0, ROW_GROUPS * BLOCK_R)
    cols = col_block * BLOCK_C + tl.arange(0, BLOCK_C)
    at = batch * R * C + rows[:, None].to(tl.int64) * C + cols[None, :]
    row_blocks = row_block0 + tl.arange(0, ROW_GROUPS)
    scale_at = batch * Rb * Cb + row_blocks * Cb + col_block
    return at, (rows[:, None] < R) & (cols[None, :] < C), scale_at, row_blocks < Rb


@_autotune
@triton.jit
def _quantize_kernel(
    x_ptr, q_ptr, scale_ptr, R, C, Rb, Cb,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ROW_GROUPS: tl.constexpr,
):  # fmt: skip
    at, inside, scale_at, scale_inside = _program_tile(R, C, Rb, Cb, BLOCK_R, BLOCK_C, ROW_GROUPS)
    x = tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32)
    amax_G = tl.max(tl.max(tl.reshape(tl.abs(x), [ROW_GROUPS, BLOCK_R, BLOCK_C]), axis=2), axis=1)
    scale_G = tl.where(amax_G > 0, tl.div_rn(amax_G, 448.0), 1.0)
    scale_rows = tl.reshape(tl.broadcast_to(scale_G[:, None], [ROW_GROUPS, BLOCK_R]), [ROW_GROUPS * BLOCK_R])
    v = tl.clamp(tl.div_rn(x, scale_rows[:, None]), -448.0, 448.0)
    tl.store(q_ptr + at, _round_to_e4m3_grid(v).to(q_ptr.dtype.element_ty), mask=inside)
    tl.store(scale_ptr + scale_at, scale_G, mask=scale_inside)


@_autotune
@triton.jit
def _dequantize_kernel(
    q_ptr, scale_ptr, x_ptr, R, C, Rb, Cb,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ROW_GROUPS: tl.constexpr,
):  # fmt: skip
    at, inside, scale_at, scale_inside = _program_tile(R, C, Rb, Cb, BLOCK_R, BLOCK_C, ROW_GROUPS)
    q = tl.load(q_ptr + at, mask=inside, other=0.0).to(tl.float32)
    scale_G = tl.load(scale_ptr + scale_at, mask=scale_inside, other=0.0)
    scale_rows = tl.reshape(tl.broadcast_to(scale_G[:, None], [ROW_GROUPS, BLOCK_R]), [ROW_GROUPS * BLOCK_R])
    tl.store(x_ptr + at, (q * scale_rows[:, None]).to(x_ptr.dtype.element_ty), mask=inside)


def _grid(B: int, R: int, C: int, block: tuple[int, int]):
    return lambda meta: (
        triton.cdiv(triton.cdiv(R, block[0]), meta["ROW_GROUPS"]),
        triton.cdiv(C, block[1]),
        B,
    )


@torch.library.custom_op("moe_dag::quantize_fp8_blockwise", mutates_args=())
def quantize_fp8_blockwise_op(
    x: torch.Tensor, block_rows: int, block_cols: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel behind `quantize_fp8_blockwise`."""
    block = (block_rows, block_cols)
    _check_block(block)
    B, R, C = _as_batch_rows_cols(x.shape)
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(scale_shape(x.shape, block), dtype=torch.float32, device=x.device)
    Rb, Cb = triton.cdiv(R, block_rows), triton.cdiv(C, block_cols)
    _quantize_kernel[_grid(B, R, C, block)](
        x.contiguous(), q, scale, R, C, Rb, Cb, BLOCK_R=block_rows, BLOCK_C=block_cols
    )
    return q, scale


@quantize_fp8_blockwise_op.register_fake
def _(x: torch.Tensor, block_rows: int, block_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty_like(x, dtype=FP8_DTYPE),
        x.new_empty(scale_shape(x.shape, (block_rows, block_cols)), dtype=torch.float32),
    )


@torch.library.custom_op("moe_dag::dequantize_fp8_blockwise", mutates_args=())
def dequantize_fp8_blockwise_op(
    q: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int, dtype: torch.dtype
) -> torch.Tensor:
    """The Triton kernel behind `dequantize_fp8_blockwise`."""
    block = (block_rows, block_cols)
    _check_quantized(q, scale, block)
    B, R, C = _as_batch_rows_cols(q.shape)
    x = torch.empty(q.shape, dtype=dtype, device=q.device)
    Rb, Cb = triton.cdiv(R, block_rows), triton.cdiv(C, block_cols)
    _dequantize_kernel[_grid(B, R, C, block)](
        q.contiguous(), scale.contiguous(), x, R, C, Rb, Cb, BLOCK_R=block_rows, BLOCK_C=block_cols
    )
    return x


@dequantize_fp8_blockwise_op.register_fake
def _(
    q: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int, dtype: torch.dtype
) -> torch.Tensor:
    return torch.empty_like(q, dtype=dtype)


def quantize_fp8_blockwise(
    x: torch.Tensor, block: tuple[int, int] = ACTIVATION_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """x in float8_e4m3fn with one float32 scale per block of the last two dimensions: (q, scale).

    `block` is (rows, columns): ACTIVATION_BLOCK (1, 128) for activations, WEIGHT_BLOCK (128, 128) for
    weights (leading dimensions such as experts are a batch). The Triton kernel where it can run (CUDA
    tensors on Ada or Hopper and newer, or TRITON_INTERPRET=1), else `quantize_fp8_blockwise_reference`;
    both give the same bits.
    Not differentiable: a precision recipe decides what gradient passes through quantisation.
    """
    _check_block(block)
    if fp8_triton_runs_on(x) and x.dtype in KERNEL_DTYPES and x.numel() > 0:
        return quantize_fp8_blockwise_op(x, *block)
    return quantize_fp8_blockwise_reference(x, block)


def dequantize_fp8_blockwise(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = ACTIVATION_BLOCK,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # fmt: skip
    """q * scale per block, in `dtype`: the inverse of `quantize_fp8_blockwise` up to e4m3 rounding."""
    _check_quantized(q, scale, block)
    if fp8_triton_runs_on(q, scale) and dtype in KERNEL_DTYPES and q.numel() > 0:
        return dequantize_fp8_blockwise_op(q, scale, *block, dtype)
    return dequantize_fp8_blockwise_reference(q, scale, block, dtype)
