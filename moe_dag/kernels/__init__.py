"""Triton kernels, each beside the plain-PyTorch reference it is tested against."""

from moe_dag.kernels.rmsnorm import TritonRMSNorm, rms_norm, rms_norm_reference, use_triton_rms_norm

__all__ = ["TritonRMSNorm", "rms_norm", "rms_norm_reference", "use_triton_rms_norm"]
