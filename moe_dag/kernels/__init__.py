"""Triton kernels, each beside the plain-PyTorch reference it is tested against.

Each entry point below runs the Triton kernel on CUDA tensors (or on any tensor when TRITON_INTERPRET=1
was set before import) and its reference elsewhere, with the same signature:

    route(logits_NE, bias_E, top_k, score_fn) -> (expert_NK, gate_NK, counts_E)
    permute(x_ND, expert_NK, num_experts) -> (x_MD, counts_E, row_NK)
    unpermute(y_MD, row_NK, gate_NK) -> y_ND
    grouped_mm(x_MD, w_EDF, offsets_E) -> y_MF
    grouped_mm_fp8(xq_MD, x_scale_MDb, wq_EDF, w_scale_EDbFb, offsets_E, out_dtype) -> y_MF
    quantize_fp8_blockwise(x, block) -> (q, scale);  dequantize_fp8_blockwise(q, scale, block, dtype) -> x
    rms_norm(x, weight, eps) -> y
"""

from moe_dag.kernels.fp8 import (
    ACTIVATION_BLOCK,
    WEIGHT_BLOCK,
    dequantize_fp8_blockwise,
    quantize_fp8_blockwise,
)
from moe_dag.kernels.grouped_gemm import grouped_mm, grouped_mm_fp8
from moe_dag.kernels.permute import permute, unpermute
from moe_dag.kernels.rmsnorm import TritonRMSNorm, rms_norm, rms_norm_reference, use_triton_rms_norm
from moe_dag.kernels.router import route

__all__ = [
    "ACTIVATION_BLOCK",
    "WEIGHT_BLOCK",
    "TritonRMSNorm",
    "dequantize_fp8_blockwise",
    "grouped_mm",
    "grouped_mm_fp8",
    "permute",
    "quantize_fp8_blockwise",
    "rms_norm",
    "rms_norm_reference",
    "route",
    "unpermute",
    "use_triton_rms_norm",
]
