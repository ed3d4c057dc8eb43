"""Peak FLOP/s for model FLOPs utilisation (MFU = achieved model FLOP/s / peak).

On a GPU the peak is the datasheet's dense figure for the recipe's number format; on a CPU there is
no honest datasheet figure, so the peak is measured: the best fp32 matrix-product rate this process
reaches on square products, the ceiling for a matmul-bound training step. `train.peak_tflops`
overrides both.
"""

from __future__ import annotations

import functools
import time

import torch

# Dense tensor-core TFLOP/s by device name fragment: (bf16, fp8, fp4), from NVIDIA's datasheets.
_DATASHEET_TFLOPS = (
    ("B200", (2250.0, 4500.0, 9000.0)),
    ("B100", (1750.0, 3500.0, 7000.0)),
    ("H200", (989.4, 1978.9, None)),
    ("H100", (989.4, 1978.9, None)),
    ("A100", (312.0, None, None)),
)


@functools.cache
def measured_cpu_flops(size: int = 512, seconds: float = 0.25) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm up
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - started))
    return best


def peak_flops(device: torch.device, recipe: str, configured_tflops: float | None) -> float | None:
    """Peak FLOP/s for `device` under precision `recipe`, or None when unknown (MFU not logged)."""
    if configured_tflops is not None:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return measured_cpu_flops()
    name = torch.cuda.get_device_name(device)
    column = 2 if recipe.startswith("nvfp4") else 1 if recipe.startswith("fp8") else 0
    for fragment, figures in _DATASHEET_TFLOPS:
        if fragment in name and figures[column] is not None:
            return figures[column] * 1e12
    return None
