"""RMSNorm over the last dimension: Triton kernels beside the plain-PyTorch reference they must match.

    y = x / sqrt(mean(x^2) + eps) * weight

weight is one gain per feature (D,) or one gain for all of them (1,), as the MoE's output norm has.

Both kernels read a row at a time (one block covers the whole hidden size, so D is capped at
MAX_HIDDEN_SIZE) and accumulate in float32 whatever the input dtype. With r = 1 / sqrt(mean(x^2) + eps),
x_hat = x * r and g = dy * weight, the gradients are

    dx = r * (g - x_hat * sum(g * x_hat) / D)        (r depends on every x_j: d r / d x_j = -r^3 x_j / D)
    dweight = sum over rows of dy * x_hat            (and over features too for a single gain)

Forward saves r per row (float32) so backward does not recompute the reduction. The backward kernel runs
a fixed number of programs that each walk a slice of rows and keep their dweight partial sum in
registers; the partials are summed afterwards, which avoids atomics and keeps the result deterministic.

The kernels are registered as `torch.library.custom_op`s with `register_fake` (so torch.compile can trace
through them) and an autograd formula. `rms_norm` is the entry point: Triton on CUDA tensors, or on any
device when TRITON_INTERPRET=1 was set before this module was imported (how the CPU tests run them), and
the reference otherwise. A model opts in from outside with `use_triton_rms_norm(model)`.

Tensor shape letters: N rows (every leading dimension flattened), D hidden size, P backward programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn

from moe_dag.kernels.backend import multiprocessor_count, triton_runs_on

# One block holds a whole row in registers. Compiled for sm_90 with the warps below, ptxas reports no
# spills up to D = 8192 and ~130 bytes of stack in backward at 16384; at 32768 backward spills kilobytes,
# so wider rows go to the reference.
MAX_HIDDEN_SIZE = 16384
# The kernels compute in float32, so float64 input goes to the reference rather than losing precision.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _RMSNormReference(torch.autograd.Function):
    """The reference's forward and the backward formulas above, in as few passes over x as eager
    PyTorch allows: autograd of the plain expression walks the [N, D] rows about twice as often, which
    on CPU, where the reference is what trains, cost more than the matrix products beside it.

    Written with x rather than x_hat (sum(g * x_hat) = r * sum(g * x)), so x_hat is never materialised;
    a single gain folds into the per-row factors, which leaves three passes over the rows in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        x_c, weight_c = x.to(compute_dtype), weight.to(compute_dtype)
        # vector_norm reduces in one pass, where vecdot(x, x) writes the products to a new [N, D] first
        mean_square = torch.linalg.vector_norm(x_c, dim=-1).square_().div_(x.shape[-1])
        rstd = torch.rsqrt(mean_square.add_(eps)).unsqueeze(-1)
        ctx.save_for_backward(x, weight, rstd)
        if weight.numel() == 1:
            return (x_c * (rstd * weight_c)).to(x.dtype)
        return (x_c * rstd).mul_(weight_c).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        compute_dtype, D = rstd.dtype, x.shape[-1]
        dy_c, x_c, weight_c = dy.to(compute_dtype), x.to(compute_dtype), weight.to(compute_dtype)
        single_gain = weight.numel() == 1
        g = dy_c if single_gain else dy_c * weight_c  # a single gain multiplies dx at the end instead
        g_dot_x = torch.linalg.vecdot(g, x_c).unsqueeze(-1)
        row_scale = rstd * weight_c if single_gain else rstd
        dx = torch.addcmul(g, x_c, g_dot_x * rstd.square() / -D).mul_(row_scale).to(x.dtype)
        dweight = None
        if ctx.needs_input_grad[1]:
            if single_gain:
                dweight = (g_dot_x * rstd).sum().reshape(1)
            else:
                dweight = torch.mv((dy_c * x_c).reshape(-1, D).t(), rstd.reshape(-1))
            dweight = dweight.to(weight.dtype)
        return dx, dweight, None


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain PyTorch, computed in float32 (or float64 for float64 input), returned in x's dtype:
    x * rsqrt(mean(x^2) + eps) * weight, with the backward written out (tested against autograd of
    that expression)."""
    _check_inputs(x, weight)
    return _RMSNormReference.apply(x, weight, eps)


@triton.jit
def _rms_norm_forward_kernel(x_ptr, weight_ptr, y_ptr, rstd_ptr, D, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=in_row, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    tl.store(y_ptr + row * D + cols, (x * rstd * weight).to(y_ptr.dtype.element_ty), mask=in_row)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_backward_kernel(
    dy_ptr, x_ptr, weight_ptr, rstd_ptr, dx_ptr, dweight_partial_ptr, N, D, rows_per_program,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    program = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < D
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    dweight = tl.zeros([BLOCK_D], dtype=tl.float32)
    row_start = program * rows_per_program
    for row in range(row_start, tl.minimum(row_start + rows_per_program, N)):
        x = tl.load(x_ptr + row * D + cols, mask=in_row, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * D + cols, mask=in_row, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        x_hat = x * rstd
        g = dy * weight
        dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / D))
        tl.store(dx_ptr + row * D + cols, dx.to(dx_ptr.dtype.element_ty), mask=in_row)
        dweight += dy * x_hat
    tl.store(dweight_partial_ptr + program * D + cols, dweight, mask=in_row)


def _launch_config(D: int) -> tuple[int, int]:
    """Block size and warps for a row of D elements: wider rows spread over more warps."""
    if D > MAX_HIDDEN_SIZE:
        raise ValueError(f"rms_norm kernels take a hidden size up to {MAX_HIDDEN_SIZE}, got {D}")
    block_d = triton.next_power_of_2(D)
    num_warps = 4 if block_d < 2048 else 8 if block_d < 8192 else 32
    return block_d, num_warps


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, *, per_feature_only: bool = False) -> None:
    """weight: one gain per feature (D,), or one gain for every feature (1,) where the kernels are not
    called directly (`rms_norm` expands it for them)."""
    shapes = ([(x.shape[-1],)] if x.dim() else []) + ([] if per_feature_only else [(1,)])
    if tuple(weight.shape) not in shapes:
        wanted = "(D,)" if per_feature_only else "(D,) or (1,)"
        raise ValueError(
            f"rms_norm needs weight of shape {wanted} with D x's last dimension, got x {tuple(x.shape)} and "
            f"weight {tuple(weight.shape)}"
        )


@torch.library.custom_op("moe_dag::rms_norm_forward", mutates_args=())
def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y (shape and dtype of x) and the float32 reciprocal RMS of each row, which backward reuses."""
    _check_inputs(x, weight, per_feature_only=True)
    D = x.shape[-1]
    x_ND = x.reshape(-1, D).contiguous()
    y_ND = torch.empty_like(x_ND)
    rstd_N = torch.empty(x_ND.shape[0], dtype=torch.float32, device=x.device)
    block_d, num_warps = _launch_config(D)
    _rms_norm_forward_kernel[(x_ND.shape[0],)](
        x_ND, weight.contiguous(), y_ND, rstd_N, D, eps, BLOCK_D=block_d, num_warps=num_warps
    )
    return y_ND.view(x.shape), rstd_N.view(x.shape[:-1])


@rms_norm_forward.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs(x, weight, per_feature_only=True)
    return torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("moe_dag::rms_norm_backward", mutates_args=())
def rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx (shape and dtype of x) and dweight (shape and dtype of weight)."""
    D = x.shape[-1]
    x_ND = x.reshape(-1, D).contiguous()
    dy_ND = dy.reshape(-1, D).contiguous()
    N = x_ND.shape[0]
    dx_ND = torch.empty_like(x_ND)
    programs = max(1, min(N, multiprocessor_count(x.device)))
    rows_per_program = triton.cdiv(N, programs)
    dweight_partial_PD = torch.empty(programs, D, dtype=torch.float32, device=x.device)
    block_d, num_warps = _launch_config(D)
    _rms_norm_backward_kernel[(programs,)](
        dy_ND, x_ND, weight.contiguous(), rstd.contiguous(), dx_ND, dweight_partial_PD, N, D,
        rows_per_program, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return dx_ND.view(x.shape), dweight_partial_PD.sum(0).to(weight.dtype)


@rms_norm_backward.register_fake
def _(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)


def _backward(ctx, dy: torch.Tensor, _drstd: torch.Tensor | None):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = rms_norm_backward(dy, x, weight, rstd)
    return dx, dweight, None


rms_norm_forward.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over x's last dimension: the Triton op where it can run, else `rms_norm_reference`.
    weight: one gain per feature (D,) or one for all (1,)."""
    _check_inputs(x, weight)
    if triton_runs_on(x) and x.dtype in KERNEL_DTYPES and x.shape[-1] <= MAX_HIDDEN_SIZE:
        return rms_norm_forward(x, weight.expand(x.shape[-1]), eps)[0]
    return rms_norm_reference(x, weight, eps)


class TritonRMSNorm(nn.RMSNorm):
    """nn.RMSNorm over one dimension with a weight, computed by `rms_norm`; same parameters and state."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None or len(self.normalized_shape) != 1:
            raise ValueError(
                f"TritonRMSNorm normalises one dimension with a weight, got normalized_shape="
                f"{self.normalized_shape}, elementwise_affine={self.elementwise_affine}"
            )
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps  # nn.RMSNorm's default
        return rms_norm(x, self.weight, eps)


def use_triton_rms_norm(model: nn.Module) -> int:
    """Route every eligible nn.RMSNorm in `model` through the Triton op, in place; returns how many.

    Eligible: normalises the last dimension only and has a weight (weightless norms keep PyTorch's).
    The class is swapped rather than the module replaced, as FSDP2's fully_shard does, so parameters,
    optimizer state and checkpoints are untouched.
    """
    swapped = 0
    for module in model.modules():
        if type(module) is nn.RMSNorm and len(module.normalized_shape) == 1 and module.weight is not None:
            module.__class__ = TritonRMSNorm
            swapped += 1
    return swapped
