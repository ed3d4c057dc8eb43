"""Grouped matrix products for the routed experts: rows sorted by expert, one weight matrix per expert.

    grouped_mm(x_MK, w_ENK, counts_E)[rows of expert e] = x_MK[rows of expert e] @ w_ENK[e].T

`x_MK` holds the M routed (token, expert) rows, sorted so that expert e's `counts_E[e]` rows are
contiguous and in expert order; `w_ENK` stacks one [N, K] matrix per expert, laid out like
`nn.Linear.weight` ([out, in]). `grouped_mm` picks, in this order, what measured fastest:

- `torch._grouped_mm` where this torch has it for the device and dtype: on CPU (16 and 32 bits) it
  runs the experts' products in C++, about twice as fast forward and backward as the kernels room's
  reference loop (demo sizes); on Hopper or newer GPUs in bf16, forward and backward of one 7b2a layer
  took 1.55 ms against the Triton kernel's 1.74 ms (H200, `benchmarks/kernel_speed.py`; forward alone the
  Triton kernel is 5% faster);
- the Triton grouped GEMM of the kernels room (`moe_dag.kernels.grouped_mm`) wherever else Triton runs:
  CUDA tensors in fp32 or fp16 or on GPUs before Hopper, and every tensor under TRITON_INTERPRET=1
  (how the tests run the kernels inside the model);
- `padded_grouped_mm`: scatter each expert's rows into a zero-padded [E, C_max, K] batch, one `bmm`,
  gather back; works everywhere, pays for the padding.

`looped_grouped_mm`, one product per expert in a Python loop, is the reference the tests compare with.

Shape legend: M routed rows, K input features, N output features, E experts, C rows of one expert.
"""

from __future__ import annotations

import torch

from moe_dag import kernels
from moe_dag.kernels.backend import INTERPRETED, triton_runs_on


def _torch_grouped_mm_supports(x_MK: torch.Tensor) -> bool:
    if not hasattr(torch, "_grouped_mm") or INTERPRETED:
        return False
    if x_MK.device.type == "cpu":
        return x_MK.dtype in (torch.float32, torch.bfloat16, torch.float16)
    # On CUDA, torch's grouped GEMM is a bf16 Hopper (sm90) kernel and needs 16-byte aligned rows.
    return (
        x_MK.device.type == "cuda"
        and x_MK.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x_MK.device) >= (9, 0)
        and x_MK.shape[-1] % 8 == 0
    )


def grouped_mm(x_MK: torch.Tensor, w_ENK: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
    """Per-expert x @ w[e].T over expert-sorted rows, by the fastest implementation available."""
    offsets_E = torch.cumsum(counts_E, dim=0, dtype=torch.int32)
    if _torch_grouped_mm_supports(x_MK):
        return torch._grouped_mm(x_MK, w_ENK.transpose(-2, -1), offs=offsets_E)
    if triton_runs_on(x_MK, w_ENK):
        return kernels.grouped_mm(x_MK, w_ENK.transpose(-2, -1), offsets_E)
    return padded_grouped_mm(x_MK, w_ENK, counts_E)


def padded_grouped_mm(x_MK: torch.Tensor, w_ENK: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
    E, M = w_ENK.shape[0], x_MK.shape[0]
    starts_E = torch.cumsum(counts_E, dim=0) - counts_E
    expert_M = torch.repeat_interleave(torch.arange(E, device=x_MK.device), counts_E, output_size=M)
    slot_M = torch.arange(M, device=x_MK.device) - starts_E[expert_M]
    capacity = int(counts_E.max()) if M else 0
    padded_ECK = x_MK.new_zeros(E, capacity, x_MK.shape[1])
    padded_ECK = padded_ECK.index_put((expert_M, slot_M), x_MK)
    out_ECN = torch.bmm(padded_ECK, w_ENK.transpose(-2, -1))
    return out_ECN[expert_M, slot_M]


def looped_grouped_mm(x_MK: torch.Tensor, w_ENK: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
    """The reference: one matrix product per expert."""
    parts = [x_CK @ w_ENK[e].T for e, x_CK in enumerate(x_MK.split(counts_E.tolist()))]
    return torch.cat(parts) if parts else x_MK.new_zeros(0, w_ENK.shape[1])
