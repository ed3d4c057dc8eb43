"""Every Triton kernel in moe_dag.kernels against its plain-PyTorch reference and torch.compile of it.

On one CUDA GPU, for one MoE layer's worth of tokens (default: the 7b2a preset, 16384 tokens of width
2048, 64 experts of width 512, top 8), each kernel is timed (median, `triton.testing.do_bench`) beside
baselines run in the same process: "reference" (the plain-PyTorch reference, eager) and "compiled"
(`torch.compile` of that reference). Figures per kernel:

- memory-bound kernels (router, permute, unpermute, FP8 quantise and dequantise, RMSNorm): effective
  bandwidth over the bytes a fused kernel cannot avoid, as a share of the GPU's HBM peak (datasheet)
  and of a device-to-device copy measured here;
- grouped GEMM (bf16, FP8): the time of one dense bf16 GEMM with the same total FLOPs (M x D @ D x F)
  over the kernel's time, so 1.0 means as fast as a dense GEMM; torch._grouped_mm is a third baseline;
- every kernel: its largest difference from the reference.

    .venv/bin/python -m benchmarks.kernel_speed [--tokens N] [--preset 7b2a|16b4a]

Without a CUDA device (or with TRITON_INTERPRET=1 set) it measures nothing and says why. Prints one
line per kernel, then as the last line one JSON object: `bench`, `device`, and per kernel its figures.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton.testing

from benchmarks._smoke import parse_with_smoke
from moe_dag.kernels import backend
from moe_dag.kernels.fp8 import (
    ACTIVATION_BLOCK,
    WEIGHT_BLOCK,
    dequantize_fp8_blockwise,
    dequantize_fp8_blockwise_reference,
    quantize_fp8_blockwise,
    quantize_fp8_blockwise_reference,
)
from moe_dag.kernels.grouped_gemm import (
    grouped_mm,
    grouped_mm_fp8,
    grouped_mm_fp8_reference,
    grouped_mm_reference,
)
from moe_dag.kernels.permute import permute, permute_reference, unpermute, unpermute_reference
from moe_dag.kernels.rmsnorm import rms_norm, rms_norm_reference
from moe_dag.kernels.router import route, route_reference

# Datasheet HBM bandwidth in bytes/s, matched in this order against torch.cuda.get_device_name().
HBM_PEAK = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100": 2.0e12,
    "B200": 8e12,
}
# (d_model, experts, top k, expert width) of the model presets in moe_dag.training.config.
PRESETS = {"7b2a": (2048, 64, 8, 512), "16b4a": (3072, 64, 8, 896)}
EPS = 1e-6

Timer = Callable[[Callable[[], object]], float]
Sides = dict[str, Callable[..., object]]


@dataclass(frozen=True, slots=True)
class Layer:
    """One MoE layer's shapes: N tokens of width D, E experts of width F, K chosen per token."""

    N: int
    D: int
    E: int
    K: int
    F: int

    @property
    def M(self) -> int:
        return self.N * self.K

    @property
    def flops(self) -> int:
        """Of one expert projection over every routed row: M x D @ D x F."""
        return 2 * self.M * self.D * self.F


@dataclass(frozen=True, slots=True)
class Bench:
    timer: Timer
    hbm_peak: float | None  # bytes/s from the datasheet, None for an unknown device
    copy_bandwidth: float  # bytes/s of a device-to-device copy, measured

    def times(self, sides: Sides, *args: object) -> dict[str, float]:
        """Milliseconds of side(*args) per side. Each runs once first, so compiling is not timed."""
        for fn in sides.values():
            fn(*args)
        return {side: self.timer(lambda fn=fn: fn(*args)) for side, fn in sides.items()}

    def bandwidth(self, nbytes: int, ms: dict[str, float]) -> dict[str, object]:
        """Effective bandwidth of each side, the kernel's share of the HBM peak and of a copy, speedups."""
        gb_per_s = {side: nbytes / (t * 1e-3) / 1e9 for side, t in ms.items()}
        return {
            "bytes": nbytes,
            "ms": rounded(ms, 4),
            "gb_per_s": rounded(gb_per_s, 1),
            "hbm_share": round(gb_per_s["triton"] * 1e9 / self.hbm_peak, 3) if self.hbm_peak else None,
            "copy_share": round(gb_per_s["triton"] * 1e9 / self.copy_bandwidth, 3),
            "speedup_vs_reference": round(ms["reference"] / ms["triton"], 2),
            "speedup_vs_compiled": round(ms["compiled"] / ms["triton"], 2),
        }


def rounded(values: dict[str, float], digits: int) -> dict[str, float]:
    return {k: round(v, digits) for k, v in values.items()}


def with_compiled(triton_fn: Callable[..., object], reference: Callable[..., object]) -> Sides:
    return {"triton": triton_fn, "reference": reference, "compiled": torch.compile(reference)}


def forward_backward(sides: Sides, inputs: tuple[torch.Tensor, ...], dy: torch.Tensor) -> Sides:
    """Each side turned into forward + gradients with respect to `inputs` (which require grad)."""
    return {
        side: (lambda *args, fn=fn: torch.autograd.grad(fn(*args), inputs, dy)) for side, fn in sides.items()
    }


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0


def copy_bandwidth(timer: Timer, device: str) -> float:
    """Bytes/s of copying 1 GiB on the device (read + write): the practical ceiling of a streaming kernel."""
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (timer(lambda: dst.copy_(src)) * 1e-3)


def routed_inputs(layer: Layer, device: str) -> dict[str, torch.Tensor]:
    """Router logits, the routing they give, tokens, their sorted rows: what the kernels below share."""
    torch.manual_seed(0)
    logits = torch.randn(layer.N, layer.E, device=device)
    bias = 0.01 * torch.randn(layer.E, device=device)
    expert, gate, _ = route_reference(logits, bias, layer.K, "sigmoid")
    x = torch.randn(layer.N, layer.D, device=device, dtype=torch.bfloat16)
    x_MD, counts, row = permute_reference(x, expert, layer.E)
    w_EFD = torch.randn(layer.E, layer.F, layer.D, device=device, dtype=torch.bfloat16) / layer.D**0.5
    return {
        "logits": logits, "bias": bias, "expert": expert, "gate": gate, "x": x, "x_MD": x_MD, "row": row,
        "offsets": counts.cumsum(0, dtype=torch.int32), "w_EFD": w_EFD,
    }  # fmt: skip


def bench_router(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    args = (inputs["logits"], inputs["bias"], layer.K, "sigmoid")
    # Reads the logits; writes expert ids (int64), gates (float32) and the counts.
    figures = bench.bandwidth(
        layer.N * layer.E * 4 + layer.M * 12, bench.times(with_compiled(route, route_reference), *args)
    )
    (expert, gate, counts), expected = route(*args), route_reference(*args)
    figures["same_experts_share"] = (expert == expected[0]).double().mean().item()
    figures["max_abs_err_gate"] = max_error(gate, expected[1])
    figures["counts_equal"] = bool(torch.equal(counts, expected[2]))
    return figures


def bench_permute(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    args = (inputs["x"], inputs["expert"], layer.E)
    # Reads the tokens and the expert ids; writes K copies of every token and the row index.
    nbytes = (layer.N + layer.M) * layer.D * 2 + layer.M * 12
    figures = bench.bandwidth(nbytes, bench.times(with_compiled(permute, permute_reference), *args))
    figures["exact"] = all(
        torch.equal(a, b) for a, b in zip(permute(*args), permute_reference(*args), strict=True)
    )
    return figures


def bench_unpermute(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    args = (inputs["x_MD"], inputs["row"], inputs["gate"])
    # Reads every sorted row, the row index and the gates; writes one row per token.
    nbytes = (layer.M + layer.N) * layer.D * 2 + layer.M * 8
    figures = bench.bandwidth(nbytes, bench.times(with_compiled(unpermute, unpermute_reference), *args))
    figures["max_abs_err"] = max_error(unpermute(*args), unpermute_reference(*args))
    return figures


def bench_quantize(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    """The sorted rows in 1x128 tiles (as an FP8 dispatch would send them), the weights in 128x128 blocks."""
    sides = with_compiled(quantize_fp8_blockwise, quantize_fp8_blockwise_reference)
    figures: dict[str, object] = {}
    for name, x, block in (
        ("activations_1x128", inputs["x_MD"], ACTIVATION_BLOCK),
        ("weights_128x128", inputs["w_EFD"], WEIGHT_BLOCK),
    ):
        # Reads bf16; writes a byte per value and a float32 scale per block.
        nbytes = x.numel() * 3 + x.numel() // (block[0] * block[1]) * 4
        figures[name] = bench.bandwidth(nbytes, bench.times(sides, x, block))
        (q, scale), (q_ref, scale_ref) = (
            quantize_fp8_blockwise(x, block),
            quantize_fp8_blockwise_reference(x, block),
        )
        figures[name]["bit_exact"] = bool(
            torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)
        )
    return figures


def bench_dequantize(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    args = quantize_fp8_blockwise(inputs["x_MD"])
    sides = with_compiled(dequantize_fp8_blockwise, dequantize_fp8_blockwise_reference)
    figures = bench.bandwidth(args[0].numel() * 3 + args[1].numel() * 4, bench.times(sides, *args))
    figures["max_abs_err"] = max_error(
        dequantize_fp8_blockwise(*args), dequantize_fp8_blockwise_reference(*args)
    )
    return figures


def dense_gemm_ms(bench: Bench, layer: Layer, device: str) -> dict[str, float]:
    """One bf16 GEMM with the grouped GEMM's total FLOPs: forward, and forward + backward (3 GEMMs)."""
    a = torch.randn(layer.M, layer.D, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(layer.D, layer.F, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(layer.M, layer.F, device=device, dtype=torch.bfloat16)
    matmul = {"dense": torch.matmul}
    with torch.no_grad():
        forward = bench.times(matmul, a, b)["dense"]
    return {"fwd": forward, "fwd_bwd": bench.times(forward_backward(matmul, (a, b), dy), a, b)["dense"]}


def bench_grouped_mm(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    x_MD = inputs["x_MD"].detach().requires_grad_()
    w_EFD = inputs["w_EFD"].detach().requires_grad_()
    dy = torch.randn(layer.M, layer.F, device=x_MD.device, dtype=torch.bfloat16)
    sides = with_compiled(grouped_mm, grouped_mm_reference)
    sides["torch_grouped_mm"] = lambda x, w, offsets: torch._grouped_mm(x, w, offs=offsets)
    # The model's weights are (E, F, D); the experts multiply by their transpose, a strided view.
    sides = {
        side: (lambda x, w_EFD, offsets, fn=fn: fn(x, w_EFD.transpose(1, 2), offsets))
        for side, fn in sides.items()
    }
    args = (x_MD, w_EFD, inputs["offsets"])
    with torch.no_grad():
        forward = bench.times(sides, *args)
    both = bench.times(forward_backward(sides, (x_MD, w_EFD), dy), *args)
    dense = dense_gemm_ms(bench, layer, x_MD.device)
    figures: dict[str, object] = {"flops": layer.flops, "dense_bf16_ms": rounded(dense, 4)}
    for pass_, ms in (("fwd", forward), ("fwd_bwd", both)):
        figures[f"{pass_}_ms"] = rounded(ms, 4)
        figures[f"{pass_}_share_of_dense"] = round(dense[pass_] / ms["triton"], 3)
        figures[f"{pass_}_torch_grouped_mm_share_of_dense"] = round(dense[pass_] / ms["torch_grouped_mm"], 3)
    figures["fwd_tflops"] = round(layer.flops / (forward["triton"] * 1e-3) / 1e12, 1)
    with torch.no_grad():
        figures["max_abs_err_vs_torch_grouped_mm"] = max_error(
            sides["triton"](*args), sides["torch_grouped_mm"](*args)
        )
    return figures


def bench_grouped_mm_fp8(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    xq, x_scale = quantize_fp8_blockwise(inputs["x_MD"])
    wq, w_scale = quantize_fp8_blockwise(inputs["w_EFD"], WEIGHT_BLOCK)
    args = (xq, x_scale, wq.transpose(1, 2), w_scale.transpose(1, 2), inputs["offsets"])
    ms = bench.times(with_compiled(grouped_mm_fp8, grouped_mm_fp8_reference), *args)
    dense = dense_gemm_ms(bench, layer, xq.device)["fwd"]
    return {
        "flops": layer.flops,
        "ms": rounded(ms, 4),
        "dense_bf16_ms": round(dense, 4),
        "share_of_dense_bf16": round(dense / ms["triton"], 3),
        "tflops": round(layer.flops / (ms["triton"] * 1e-3) / 1e12, 1),
        "max_abs_err": max_error(grouped_mm_fp8(*args), grouped_mm_fp8_reference(*args)),
    }


def bench_rms_norm(bench: Bench, layer: Layer, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    x = inputs["x"].detach().requires_grad_()
    weight = torch.ones(layer.D, device=x.device, dtype=x.dtype, requires_grad=True)
    sides = with_compiled(rms_norm, rms_norm_reference)
    with torch.no_grad():
        forward = bench.times(sides, x, weight, EPS)
    both = bench.times(forward_backward(sides, (x, weight), torch.randn_like(x)), x, weight, EPS)
    # Forward reads x and writes y; backward reads x and dy and writes dx.
    return {
        "fwd": bench.bandwidth(2 * x.numel() * 2, forward),
        "fwd_bwd": bench.bandwidth(5 * x.numel() * 2, both),
        "max_abs_err": max_error(rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS)),
    }


BENCHES = {
    "router": bench_router,
    "permute": bench_permute,
    "unpermute": bench_unpermute,
    "quantize_fp8": bench_quantize,
    "dequantize_fp8": bench_dequantize,
    "grouped_mm": bench_grouped_mm,
    "grouped_mm_fp8": bench_grouped_mm_fp8,
    "rms_norm": bench_rms_norm,
}


def measure(layer: Layer, bench: Bench, device: str) -> dict[str, object]:
    inputs = routed_inputs(layer, device)
    results: dict[str, object] = {}
    for name, run in BENCHES.items():
        results[name] = run(bench, layer, inputs)
        print(f"{name}: {json.dumps(results[name])}")
    return results


def hbm_peak(device_name: str) -> float | None:
    return next((peak for key, peak in HBM_PEAK.items() if key in device_name), None)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per layer call (batch x sequence)")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="7b2a", help="model preset for the shapes"
    )
    args = parse_with_smoke(parser, {"tokens": 512}, argv)
    summary: dict[str, object] = {"bench": "kernel_speed", "kernels": list(BENCHES)}
    if not torch.cuda.is_available():
        print("measured nothing: no CUDA device (this benchmark times compiled Triton kernels on a GPU)")
        return summary | {"device": "cpu", "skipped": "no CUDA device"}
    device_name = torch.cuda.get_device_name()
    if backend.INTERPRETED:
        print("measured nothing: TRITON_INTERPRET=1 is set, so the kernels would run in the interpreter")
        return summary | {"device": device_name, "skipped": "TRITON_INTERPRET=1 is set"}

    D, E, K, F = PRESETS[args.preset]
    layer = Layer(N=args.tokens, D=D, E=E, K=K, F=F)

    def timer(fn: Callable[[], object]) -> float:
        return triton.testing.do_bench(fn, return_mode="median")

    bench = Bench(timer=timer, hbm_peak=hbm_peak(device_name), copy_bandwidth=copy_bandwidth(timer, "cuda"))
    peak = f"{bench.hbm_peak / 1e9:.0f} GB/s" if bench.hbm_peak else "unknown"
    copy = f"{bench.copy_bandwidth / 1e9:.0f} GB/s"
    print(f"{device_name}, {args.preset} layer {layer}: HBM peak {peak} (datasheet), copy {copy} (measured)")
    results = measure(layer, bench, "cuda")
    return summary | {
        "device": device_name,
        "preset": args.preset,
        "shape": {"N": layer.N, "D": D, "E": E, "K": K, "F": F},
        "hbm_peak_gb_per_s": bench.hbm_peak / 1e9 if bench.hbm_peak else None,
        "copy_gb_per_s": round(bench.copy_bandwidth / 1e9, 1),
        "baselines": {"reference": "plain-PyTorch reference, eager", "compiled": "torch.compile(reference)"},
        **results,
    }


if __name__ == "__main__":
    print(json.dumps(main()))
