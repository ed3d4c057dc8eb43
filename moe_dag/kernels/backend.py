"""Where the Triton kernels run, decided once per process, and the autotuning configs they try.

Triton decides when a kernel is decorated whether it is compiled or interpreted, so the choice is read
here, at import, and holds for the process: TRITON_INTERPRET=1 set before `moe_dag.kernels` is imported
runs every kernel through Triton's interpreter on CPU tensors (how the tests check them against their
references); otherwise the kernels run on CUDA tensors and every dispatcher sends anything else to the
plain-PyTorch reference.
"""

from __future__ import annotations

import torch
import triton

INTERPRETED = bool(triton.knobs.runtime.interpret)


def triton_runs_on(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernels can take these tensors: all on CUDA, or any device when interpreted."""
    return INTERPRETED or all(t.is_cuda for t in tensors)


def fp8_triton_runs_on(*tensors: torch.Tensor) -> bool:
    """`triton_runs_on`, and on CUDA only from compute capability 8.9 (Ada, Hopper): Triton has no e4m3
    type on older GPUs."""
    if INTERPRETED:
        return True
    return triton_runs_on(*tensors) and all(
        torch.cuda.get_device_capability(t.device) >= (8, 9) for t in tensors
    )


def autotune_configs(gpu: list[triton.Config], interpreted: triton.Config) -> list[triton.Config]:
    """Every GPU config to time on a GPU; under the interpreter only `interpreted`, since timing the
    interpreter measures nothing and every extra config would rerun the kernel on CPU."""
    return [interpreted] if INTERPRETED else gpu


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors on a CUDA device; under the interpreter a small stand-in, since programs
    run one after another there and the count only sizes persistent grids and partial-sum buffers."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
