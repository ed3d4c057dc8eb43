"""RMSNorm: the compiled Triton kernels against the baseline "PyTorch eager reference", side by side.

For each shape and dtype, on one CUDA device: forward and forward+backward time of
`moe_dag.kernels.rmsnorm.rms_norm` (the Triton custom op) and of `rms_norm_reference` (plain PyTorch,
eager), as effective bandwidth and as a speedup, plus each side's max abs error against a float64
reference. Bandwidth counts the traffic a fused kernel cannot avoid, the same bytes for both sides:
forward reads x and writes y (2 N D elements), backward reads x and dy and writes dx (3 N D more); the
weight and the per-row statistics are small next to that and left out.

    .venv/bin/python benchmarks/rmsnorm.py

Without a CUDA device (or with TRITON_INTERPRET=1 set) it measures nothing, says why and exits 0.
Prints human-readable lines, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import json

import torch
import triton.testing

from moe_dag.kernels import rmsnorm
from moe_dag.kernels.rmsnorm import rms_norm, rms_norm_reference

EPS = 1e-6
# Token rows x hidden size: a small model, a 7B-class width, a wide one, and a non-power-of-two width.
SHAPES = [(8192, 1024), (8192, 4096), (16384, 8192), (8192, 5120)]
DTYPES = [torch.bfloat16, torch.float32]


def median_ms(fn) -> float:
    return triton.testing.do_bench(fn, return_mode="median")


def max_errors(norm, x, weight, dy, expected: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max abs error of y, dx and dweight from `norm` against the float64 values in `expected`."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    y = norm(x, weight, EPS)
    dx, dweight = torch.autograd.grad(y, (x, weight), dy)
    got = {"y": y, "dx": dx, "dweight": dweight}
    return {k: (got[k].double() - expected[k]).abs().max().item() for k in expected}


def measure(rows: int, hidden: int, dtype: torch.dtype, device: str = "cuda") -> dict[str, object]:
    torch.manual_seed(0)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, requires_grad=True)
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype).requires_grad_()
    dy = torch.randn(rows, hidden, device=device, dtype=dtype)

    x64, weight64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    y64 = rms_norm_reference(x64, weight64, EPS)
    dx64, dweight64 = torch.autograd.grad(y64, (x64, weight64), dy.double())
    expected = {"y": y64.detach(), "dx": dx64, "dweight": dweight64}
    del x64, weight64, y64

    result: dict[str, object] = {"rows": rows, "hidden": hidden, "dtype": str(dtype).removeprefix("torch.")}
    forward_bytes = 2 * x.numel() * x.element_size()
    backward_bytes = 3 * x.numel() * x.element_size()
    ms: dict[str, float] = {}
    for side, norm in (("triton", rms_norm), ("reference", rms_norm_reference)):
        with torch.no_grad():
            ms[f"{side}_fwd"] = median_ms(lambda norm=norm: norm(x, weight, EPS))
        ms[f"{side}_fwd_bwd"] = median_ms(
            lambda norm=norm: torch.autograd.grad(norm(x, weight, EPS), (x, weight), dy)
        )
        result[f"{side}_fwd_gb_per_s"] = round(forward_bytes / ms[f"{side}_fwd"] / 1e6, 1)
        result[f"{side}_fwd_bwd_gb_per_s"] = round(
            (forward_bytes + backward_bytes) / ms[f"{side}_fwd_bwd"] / 1e6, 1
        )
        result[f"{side}_max_abs_err"] = max_errors(norm, x, weight, dy, expected)
    for pass_ in ("fwd", "fwd_bwd"):
        result[f"{pass_}_speedup"] = round(ms[f"reference_{pass_}"] / ms[f"triton_{pass_}"], 2)
    return result


def describe(r: dict[str, object]) -> str:
    errors = {side: r[f"{side}_max_abs_err"] for side in ("triton", "reference")}
    return (
        f"{r['rows']:>6} x {r['hidden']:<5} {r['dtype']:<8}"
        f" fwd {r['triton_fwd_gb_per_s']:7.1f} vs {r['reference_fwd_gb_per_s']:7.1f} GB/s"
        f" ({r['fwd_speedup']:.2f}x)"
        f"  fwd+bwd {r['triton_fwd_bwd_gb_per_s']:7.1f} vs {r['reference_fwd_bwd_gb_per_s']:7.1f} GB/s"
        f" ({r['fwd_bwd_speedup']:.2f}x)"
        + "".join(
            f"  {side} max err y {e['y']:.1e} dx {e['dx']:.1e} dw {e['dweight']:.1e}"
            for side, e in errors.items()
        )
    )


def main() -> dict[str, object]:
    if not torch.cuda.is_available():
        print("measured nothing: no CUDA device (this benchmark times compiled Triton kernels on a GPU)")
        return {"benchmark": "rmsnorm", "device": "cpu", "skipped": "no CUDA device"}
    device = torch.cuda.get_device_name()
    if rmsnorm.INTERPRETED:
        print("measured nothing: TRITON_INTERPRET=1 is set, so the kernels would run in the interpreter")
        return {"benchmark": "rmsnorm", "device": device, "skipped": "TRITON_INTERPRET=1 is set"}
    print(f"{device}: Triton kernels vs PyTorch eager reference (GB/s, speedup), max abs error vs float64")
    results = []
    for rows, hidden in SHAPES:
        for dtype in DTYPES:
            results.append(measure(rows, hidden, dtype))
            print(describe(results[-1]))
    return {
        "benchmark": "rmsnorm",
        "baseline": "pytorch_eager_reference",
        "device": device,
        "results": results,
    }


if __name__ == "__main__":
    print(json.dumps(main()))
