"""Grouped GEMM for the experts, bf16 and FP8 with block scales: Triton kernels beside their references.

The rows of x are sorted by expert (as `permute` leaves them): expert e owns rows offsets[e-1]:offsets[e]
(offsets[-1] = 0), and y[those rows] = x[those rows] @ w[e]. Offsets are cumulative ends in int32, the
convention of `torch._grouped_mm`; an expert with no rows has offsets[e] = offsets[e-1]. offsets[E-1]
must equal M (the reference checks; the kernels trust it so they never wait on the GPU).

One persistent kernel serves both precisions. It runs one program per streaming multiprocessor; each
walks the (expert, row tile, column tile) list with a stride of the program count, reading the offsets
on the device, so no tile list is built on the host and nothing waits for the routing to finish. Tiles
of one row block are adjacent in that list, so programs running together share x rows in L2.

FP8 (DeepSeek-V3, arXiv:2412.19437, sec. 3.3): x in e4m3 with a scale per 1x128 tile along D, w with a
scale per 128x128 block. Each 128-wide step along D is a separate FP8 product, scaled and added to a
float32 accumulator ("promotion"), so the scales never enter the tensor-core inner loop.

Backward (bf16 path): dx = grouped_mm(dy, w transposed) by the same kernel with swapped strides, and
dw[e] = x[rows of e]^T @ dy[rows of e] by a second kernel, one program per (expert, D tile, F tile).
Weights may be strided views (the model stores w as (E, F, D) and passes its transpose); dw is laid out
as w is, so the transpose back is free.

Shape legend: M rows sorted by expert, E experts, D input width (the contraction), F output width,
Db and Fb 128-wide blocks of D and F (FP8 scales).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_dag.kernels.backend import (
    INTERPRETED,
    autotune_configs,
    fp8_triton_runs_on,
    multiprocessor_count,
    triton_runs_on,
)
from moe_dag.kernels.fp8 import ACTIVATION_BLOCK, FP8_DTYPE, WEIGHT_BLOCK, dequantize_fp8_blockwise_reference

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SCALE_BLOCK = 128


def _check_inputs(x_MD: torch.Tensor, w_EDF: torch.Tensor, offsets_E: torch.Tensor) -> None:
    if x_MD.dim() != 2 or w_EDF.dim() != 3 or x_MD.shape[1] != w_EDF.shape[1]:
        raise ValueError(
            f"grouped_mm needs x of shape (M, D) and w of shape (E, D, F), got x {tuple(x_MD.shape)} and "
            f"w {tuple(w_EDF.shape)}"
        )
    if offsets_E.shape != (w_EDF.shape[0],) or offsets_E.dtype != torch.int32:
        raise ValueError(
            f"grouped_mm needs int32 offsets of shape ({w_EDF.shape[0]},), one cumulative end per expert, "
            f"got {offsets_E.dtype} {tuple(offsets_E.shape)}"
        )


def _check_fp8_inputs(
    xq_MD: torch.Tensor, x_scale_MDb: torch.Tensor, wq_EDF: torch.Tensor, w_scale_EDbFb: torch.Tensor,
    offsets_E: torch.Tensor,
) -> None:  # fmt: skip
    _check_inputs(xq_MD, wq_EDF, offsets_E)
    E, D, F = wq_EDF.shape
    Db, Fb = triton.cdiv(D, SCALE_BLOCK), triton.cdiv(F, SCALE_BLOCK)
    expected = {
        "x": (xq_MD.dtype, FP8_DTYPE),
        "w": (wq_EDF.dtype, FP8_DTYPE),
        "x scale shape": (tuple(x_scale_MDb.shape), (xq_MD.shape[0], Db)),
        "w scale shape": (tuple(w_scale_EDbFb.shape), (E, Db, Fb)),
        "scale dtypes": ((x_scale_MDb.dtype, w_scale_EDbFb.dtype), (torch.float32, torch.float32)),
    }
    wrong = {name: got for name, (got, want) in expected.items() if got != want}
    if wrong:
        raise ValueError(
            f"grouped_mm_fp8 needs e4m3 x (M, D) with float32 scales (M, {Db}) per 1x128 tile and e4m3 w "
            f"(E, D, F) with float32 scales ({E}, {Db}, {Fb}) per 128x128 block; got {wrong}"
        )


def _expert_slices(offsets_E: torch.Tensor, M: int) -> list[slice]:
    """The rows of each expert; checks what the kernels take on trust."""
    ends = offsets_E.tolist()
    starts = [0, *ends[:-1]]
    if any(end < start for start, end in zip(starts, ends, strict=True)) or (ends and ends[-1] != M):
        raise ValueError(f"grouped_mm offsets must rise from 0 to M={M}, got {ends}")
    return [slice(start, end) for start, end in zip(starts, ends, strict=True)]


def grouped_mm_reference(x_MD: torch.Tensor, w_EDF: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch, a loop over the experts, in float32 (or float64): y_MF in x's dtype."""
    _check_inputs(x_MD, w_EDF, offsets_E)
    compute_dtype = torch.promote_types(x_MD.dtype, torch.float32)
    x_c, w_c = x_MD.to(compute_dtype), w_EDF.to(compute_dtype)
    y = [x_c[rows] @ w_c[e] for e, rows in enumerate(_expert_slices(offsets_E, x_MD.shape[0]))]
    return torch.cat(y).to(x_MD.dtype)


def grouped_mm_fp8_reference(
    xq_MD: torch.Tensor, x_scale_MDb: torch.Tensor, wq_EDF: torch.Tensor, w_scale_EDbFb: torch.Tensor,
    offsets_E: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # fmt: skip
    """Plain PyTorch: dequantise both sides to float32, then `grouped_mm_reference`."""
    x_MD = dequantize_fp8_blockwise_reference(xq_MD, x_scale_MDb, ACTIVATION_BLOCK, torch.float32)
    w_EDF = dequantize_fp8_blockwise_reference(wq_EDF, w_scale_EDbFb, WEIGHT_BLOCK, torch.float32)
    return grouped_mm_reference(x_MD, w_EDF, offsets_E).to(out_dtype)


@triton.jit
def _grouped_mm_kernel(
    x_ptr, w_ptr, y_ptr, offsets_ptr, x_scale_ptr, w_scale_ptr, E, D, F, programs,
    stride_xm, stride_xd, stride_we, stride_wd, stride_wf, stride_ym, stride_yf,
    stride_xsm, stride_xsd, stride_wse, stride_wsd, stride_wsf,
    SCALED: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    f_tiles = tl.cdiv(F, BLOCK_F)
    tile = tl.program_id(0)
    tiles_before = 0
    start = 0
    # Expert e's weights and scales, advanced by pointer so the offset never overflows 32 bits.
    w_e_ptr, w_scale_e_ptr = w_ptr, w_scale_ptr
    for e in range(E):
        end = tl.load(offsets_ptr + e)
        expert_tiles = tl.cdiv(end - start, BLOCK_M) * f_tiles
        while tile < tiles_before + expert_tiles:
            m_tile = (tile - tiles_before) // f_tiles
            f_tile = (tile - tiles_before) % f_tiles
            rows = (start + m_tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            cols = f_tile * BLOCK_F + tl.arange(0, BLOCK_F)
            in_rows, in_cols = rows < end, cols < F
            acc = tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                ds = d0 + tl.arange(0, BLOCK_D)
                in_ds = ds < D
                x = tl.load(
                    x_ptr + rows[:, None] * stride_xm + ds[None, :] * stride_xd,
                    mask=in_rows[:, None] & in_ds[None, :],
                    other=0.0,
                )
                w = tl.load(
                    w_e_ptr + ds[:, None] * stride_wd + cols[None, :] * stride_wf,
                    mask=in_ds[:, None] & in_cols[None, :],
                    other=0.0,
                )
                if SCALED:
                    # BLOCK_D = 128 and BLOCK_F divides 128: one x scale per row, one w scale per step.
                    x_scale = tl.load(
                        x_scale_ptr + rows * stride_xsm + (d0 // BLOCK_D) * stride_xsd,
                        mask=in_rows,
                        other=0.0,
                    )
                    w_scale = tl.load(
                        w_scale_e_ptr + (d0 // BLOCK_D) * stride_wsd
                        + (f_tile * BLOCK_F // 128) * stride_wsf
                    )  # fmt: skip
                    acc += tl.dot(x, w) * (x_scale[:, None] * w_scale)
                else:
                    if WIDEN:
                        x, w = x.to(tl.float32), w.to(tl.float32)
                    acc = tl.dot(x, w, acc, input_precision=PRECISION)
            tl.store(
                y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yf,
                acc.to(y_ptr.dtype.element_ty),
                mask=in_rows[:, None] & in_cols[None, :],
            )
            tile += programs
        tiles_before += expert_tiles
        start = end
        w_e_ptr += stride_we
        w_scale_e_ptr += stride_wse


_grouped_mm_bf16_kernel = triton.autotune(
    configs=autotune_configs(
        [
            triton.Config({"BLOCK_M": m, "BLOCK_F": f, "BLOCK_D": d}, num_stages=s, num_warps=w)
            for m, f, d, s, w in [
                (128, 128, 64, 3, 8),
                (128, 256, 64, 3, 8),
                (128, 128, 64, 4, 4),
                (64, 128, 64, 4, 4),
                (128, 64, 64, 4, 4),
                (64, 64, 64, 4, 4),
            ]
        ],  # fmt: skip
        interpreted=triton.Config({"BLOCK_M": 16, "BLOCK_F": 32, "BLOCK_D": 32}),
    ),
    key=["E", "D", "F", "PRECISION"],
)(_grouped_mm_kernel)

_grouped_mm_fp8_kernel = triton.autotune(
    configs=autotune_configs(
        [
            triton.Config({"BLOCK_M": m, "BLOCK_F": f, "BLOCK_D": SCALE_BLOCK}, num_stages=s, num_warps=w)
            for m, f, s, w in [(128, 128, 3, 8), (128, 128, 4, 4), (64, 128, 4, 4), (128, 64, 4, 4)]
        ],
        interpreted=triton.Config({"BLOCK_M": 16, "BLOCK_F": 32, "BLOCK_D": SCALE_BLOCK}),
    ),
    key=["E", "D", "F"],
)(_grouped_mm_kernel)


@triton.autotune(
    configs=autotune_configs(
        [
            triton.Config({"BLOCK_M": m, "BLOCK_D": d, "BLOCK_F": f}, num_stages=s, num_warps=w)
            for m, d, f, s, w in [(64, 128, 128, 3, 8), (32, 128, 128, 4, 4), (64, 64, 128, 4, 4)]
        ],
        interpreted=triton.Config({"BLOCK_M": 16, "BLOCK_D": 32, "BLOCK_F": 32}),
    ),
    key=["E", "D", "F", "PRECISION"],
)
@triton.jit
def _grouped_weight_grad_kernel(
    x_ptr, dy_ptr, dw_ptr, offsets_ptr, E, D, F,
    stride_xm, stride_xd, stride_ym, stride_yf, stride_we, stride_wd, stride_wf,
    PRECISION: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    """dw[e] = x[rows of e]^T @ dy[rows of e]; zeros for an expert without rows."""
    e = tl.program_id(1)
    f_tiles = tl.cdiv(F, BLOCK_F)
    ds = (tl.program_id(0) // f_tiles) * BLOCK_D + tl.arange(0, BLOCK_D)
    fs = (tl.program_id(0) % f_tiles) * BLOCK_F + tl.arange(0, BLOCK_F)
    in_ds, in_fs = ds < D, fs < F
    start = tl.load(offsets_ptr + e - 1, mask=e > 0, other=0)
    end = tl.load(offsets_ptr + e)
    acc = tl.zeros([BLOCK_D, BLOCK_F], dtype=tl.float32)
    for m0 in range(start, end, BLOCK_M):
        rows = (m0 + tl.arange(0, BLOCK_M)).to(tl.int64)
        in_rows = rows < end
        x_DM = tl.load(
            x_ptr + rows[None, :] * stride_xm + ds[:, None] * stride_xd,
            mask=in_ds[:, None] & in_rows[None, :],
            other=0.0,
        )
        dy_MF = tl.load(
            dy_ptr + rows[:, None] * stride_ym + fs[None, :] * stride_yf,
            mask=in_rows[:, None] & in_fs[None, :],
            other=0.0,
        )
        if WIDEN:
            x_DM, dy_MF = x_DM.to(tl.float32), dy_MF.to(tl.float32)
        acc = tl.dot(x_DM, dy_MF, acc, input_precision=PRECISION)
    tl.store(
        dw_ptr + e.to(tl.int64) * stride_we + ds[:, None] * stride_wd + fs[None, :] * stride_wf,
        acc.to(dw_ptr.dtype.element_ty),
        mask=in_ds[:, None] & in_fs[None, :],
    )


def _dot_options(dtype: torch.dtype) -> dict[str, object]:
    """float32 operands multiply in IEEE float32 as torch's matmul does, not TF32. Triton's interpreter
    keeps bfloat16 as raw 16-bit patterns and its tl.dot multiplies those as integers, so interpreted
    dots widen bfloat16 to float32 first; compiled kernels feed bfloat16 to the tensor cores."""
    return {
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "WIDEN": INTERPRETED and dtype == torch.bfloat16,
    }


def _launch_grouped_mm(kernel, x_MD, w_EDF, offsets_E, y_MF, x_scale=None, w_scale=None) -> None:
    E, D, F = w_EDF.shape
    programs = multiprocessor_count(x_MD.device)
    scaled = x_scale is not None
    scale_strides = (*x_scale.stride(), *w_scale.stride()) if scaled else (0,) * 5
    kernel[(programs,)](
        x_MD, w_EDF, y_MF, offsets_E, x_scale if scaled else x_MD, w_scale if scaled else x_MD,
        E, D, F, programs, *x_MD.stride(), *w_EDF.stride(), *y_MF.stride(), *scale_strides,
        SCALED=scaled, **_dot_options(x_MD.dtype),
    )  # fmt: skip


@torch.library.custom_op("moe_dag::grouped_mm", mutates_args=())
def grouped_mm_op(x_MD: torch.Tensor, w_EDF: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    """The Triton kernel behind `grouped_mm`."""
    _check_inputs(x_MD, w_EDF, offsets_E)
    y_MF = x_MD.new_empty(x_MD.shape[0], w_EDF.shape[2])
    _launch_grouped_mm(_grouped_mm_bf16_kernel, x_MD, w_EDF.to(x_MD.dtype), offsets_E, y_MF)
    return y_MF


@grouped_mm_op.register_fake
def _(x_MD: torch.Tensor, w_EDF: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    _check_inputs(x_MD, w_EDF, offsets_E)
    return x_MD.new_empty(x_MD.shape[0], w_EDF.shape[2])


@torch.library.custom_op("moe_dag::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad(
    x_MD: torch.Tensor, dy_MF: torch.Tensor, offsets_E: torch.Tensor, w_EDF: torch.Tensor
) -> torch.Tensor:
    """dw_EDF for `grouped_mm` (w_EDF gives shape, dtype and layout)."""
    E, D, F = w_EDF.shape
    dw_EDF = torch.empty_like(w_EDF)
    grid = lambda meta: (triton.cdiv(D, meta["BLOCK_D"]) * triton.cdiv(F, meta["BLOCK_F"]), E)  # noqa: E731
    _grouped_weight_grad_kernel[grid](
        x_MD, dy_MF, dw_EDF, offsets_E, E, D, F, *x_MD.stride(), *dy_MF.stride(), *dw_EDF.stride(),
        **_dot_options(x_MD.dtype),
    )  # fmt: skip
    return dw_EDF


@grouped_mm_weight_grad.register_fake
def _(x_MD: torch.Tensor, dy_MF: torch.Tensor, offsets_E: torch.Tensor, w_EDF: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(w_EDF)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy_MF: torch.Tensor):
    x_MD, w_EDF, offsets_E = ctx.saved_tensors
    dx_MD = grouped_mm_op(dy_MF, w_EDF.transpose(1, 2), offsets_E) if ctx.needs_input_grad[0] else None
    dw_EDF = grouped_mm_weight_grad(x_MD, dy_MF, offsets_E, w_EDF) if ctx.needs_input_grad[1] else None
    return dx_MD, dw_EDF, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("moe_dag::grouped_mm_fp8", mutates_args=())
def grouped_mm_fp8_op(
    xq_MD: torch.Tensor, x_scale_MDb: torch.Tensor, wq_EDF: torch.Tensor, w_scale_EDbFb: torch.Tensor,
    offsets_E: torch.Tensor, out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """The Triton kernel behind `grouped_mm_fp8`."""
    _check_fp8_inputs(xq_MD, x_scale_MDb, wq_EDF, w_scale_EDbFb, offsets_E)
    y_MF = torch.empty(xq_MD.shape[0], wq_EDF.shape[2], dtype=out_dtype, device=xq_MD.device)
    _launch_grouped_mm(_grouped_mm_fp8_kernel, xq_MD, wq_EDF, offsets_E, y_MF, x_scale_MDb, w_scale_EDbFb)
    return y_MF


@grouped_mm_fp8_op.register_fake
def _(
    xq_MD: torch.Tensor, x_scale_MDb: torch.Tensor, wq_EDF: torch.Tensor, w_scale_EDbFb: torch.Tensor,
    offsets_E: torch.Tensor, out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    return xq_MD.new_empty(xq_MD.shape[0], wq_EDF.shape[2], dtype=out_dtype)


def grouped_mm(x_MD: torch.Tensor, w_EDF: torch.Tensor, offsets_E: torch.Tensor) -> torch.Tensor:
    """y_MF: each expert's rows of x times its weight, y[rows of e] = x[rows of e] @ w_EDF[e].

    offsets_E: int32 cumulative row ends per expert (`counts_E.cumsum(0, dtype=torch.int32)`), as
    `torch._grouped_mm` takes them. w_EDF may be a strided view, such as `w_EFD.transpose(1, 2)`. The
    Triton kernel where it can run (CUDA tensors, or TRITON_INTERPRET=1), else `grouped_mm_reference`.
    Differentiable in x and w.
    """
    _check_inputs(x_MD, w_EDF, offsets_E)
    if triton_runs_on(x_MD, w_EDF, offsets_E) and x_MD.dtype in KERNEL_DTYPES and x_MD.shape[0] > 0:
        return grouped_mm_op(x_MD, w_EDF, offsets_E)
    return grouped_mm_reference(x_MD, w_EDF, offsets_E)


def grouped_mm_fp8(
    xq_MD: torch.Tensor, x_scale_MDb: torch.Tensor, wq_EDF: torch.Tensor, w_scale_EDbFb: torch.Tensor,
    offsets_E: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:  # fmt: skip
    """`grouped_mm` on FP8 operands from `quantize_fp8_blockwise`: x per 1x128 tile (ACTIVATION_BLOCK),
    w per 128x128 block (WEIGHT_BLOCK; quantise w_EFD and pass both values and scales transposed).

    The Triton kernel where it can run (CUDA tensors on Ada or Hopper and newer, the first GPUs with e4m3
    tensor cores, or TRITON_INTERPRET=1), else `grouped_mm_fp8_reference`. Forward only: the FP8
    training recipe decides the backward.
    """
    _check_fp8_inputs(xq_MD, x_scale_MDb, wq_EDF, w_scale_EDbFb, offsets_E)
    tensors = (xq_MD, x_scale_MDb, wq_EDF, w_scale_EDbFb, offsets_E)
    if fp8_triton_runs_on(*tensors) and xq_MD.shape[0] > 0:
        return grouped_mm_fp8_op(*tensors, out_dtype)
    return grouped_mm_fp8_reference(*tensors, out_dtype)
