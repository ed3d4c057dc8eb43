"""The MoE layer at demo sizes, forward and backward: grouped expert products against the baseline
"per-expert loop", and against the physical floor "dense chain" on this machine.

- grouped: the layer as trained (router, dispatch, `grouped_mm` over expert-sorted rows, shared
  experts, output norm);
- loop: the same layer with one matrix product per expert (`looped_grouped_mm`), the reference;
- dense chain: two plain matrix products with the FLOPs of the layer's expert and shared products
  (every routed row and every shared-expert row through D -> 2F and F -> D), forward and backward.
  `efficiency_vs_dense` = dense chain time / grouped layer time: what routing, permutation, gating
  and scatter cost on top of the unavoidable products. Goal on CPU: at least 0.7.

On CPU, torch._grouped_mm runs one product per expert, so `ratio` = loop / grouped is expected near 1;
the grouped path only has to be no slower. Sides alternate, median of the repeats.

Threads: by default each demo training worker's share of this machine's cores, as the trainer sets it
(cores // configs/demo.yaml's `training.nproc_per_node`: one on 2 cores, where the demo trains with two
expert-parallel workers). `--threads N` measures another count; at demo sizes the layer's products and
elementwise steps are too small to gain much from a second thread, while the dense floor's products do.

    .venv/bin/python -m benchmarks.moe_layer [--repeats 20] [--batch 16] [--threads N]

Last line: one JSON object with keys bench, grouped_ms, loop_ms, ratio, dense_equivalent_ms,
efficiency_vs_dense.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: idle threads must not spin

import torch  # noqa: E402

from benchmarks._smoke import parse_with_smoke  # noqa: E402
from moe_dag.config import load_config  # noqa: E402
from moe_dag.training.config import preset  # noqa: E402
from moe_dag.training.grouped_mm import grouped_mm, looped_grouped_mm  # noqa: E402
from moe_dag.training.model import build_model  # noqa: E402
from moe_dag.training.trainer import threads_per_worker  # noqa: E402

DEMO_CONFIG = "configs/demo.yaml"


def moe_layer(batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    config = dataclasses.replace(preset("demo").model, first_dense_layers=0, n_layers=1)
    torch.manual_seed(0)
    moe = build_model(config).moe_layers()[0].train()
    x = torch.randn(batch, config.seq_len, config.d_model, requires_grad=True)
    return moe, x


def dense_chain(moe: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of a two-product chain with the layer's expert and shared FLOPs."""
    E, F, D = moe.experts.w1_EFD.shape
    shared_width = moe.shared.w1.out_features if moe.shared is not None else 0
    rows = x.shape[0] * x.shape[1] * (moe.top_k + shared_width // F)
    torch.manual_seed(1)
    rows_RD = torch.randn(rows, D, requires_grad=True)
    w13_D2F = (torch.randn(D, 2 * F) / D**0.5).requires_grad_()
    w2_FD = (torch.randn(F, D) / F**0.5).requires_grad_()
    return rows_RD, w13_D2F, w2_FD


def timed_ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="sequences of the demo's 128 tokens")
    parser.add_argument("--threads", type=int, help="torch threads (default: one demo worker's share)")
    args = parse_with_smoke(parser, {"repeats": 2, "batch": 2})
    demo_workers = load_config(DEMO_CONFIG).training.nproc_per_node
    torch.set_num_threads(args.threads or threads_per_worker(demo_workers))
    moe, x = moe_layer(args.batch)
    rows_RD, w13_D2F, w2_FD = dense_chain(moe, x)
    F = w2_FD.shape[0]

    def layer_step(matmul) -> None:
        moe.experts.grouped_mm = matmul
        moe(x).sum().backward()

    def dense_step() -> None:
        hidden = rows_RD @ w13_D2F
        (hidden[:, :F] @ w2_FD).sum().backward()

    sides = {
        "grouped": lambda: layer_step(grouped_mm),
        "loop": lambda: layer_step(looped_grouped_mm),
        "dense": dense_step,
    }
    for fn in sides.values():  # warm up
        fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            times[name].append(timed_ms(fn))
    ms = {name: statistics.median(values) for name, values in times.items()}
    tokens = x.shape[0] * x.shape[1]
    print(
        f"MoE layer, demo sizes: {tokens} tokens, D={x.shape[-1]}, E={moe.num_experts}, k={moe.top_k}, "
        f"F={F}, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"  grouped (torch._grouped_mm)   {ms['grouped']:8.2f} ms  forward + backward")
    print(f"  per-expert loop (baseline)    {ms['loop']:8.2f} ms")
    print(f"  dense chain, same FLOPs       {ms['dense']:8.2f} ms  (the floor)")
    result = {
        "bench": "moe_layer",
        "grouped_ms": round(ms["grouped"], 3),
        "loop_ms": round(ms["loop"], 3),
        "ratio": round(ms["loop"] / ms["grouped"], 3),
        "dense_equivalent_ms": round(ms["dense"], 3),
        "efficiency_vs_dense": round(ms["dense"] / ms["grouped"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
