"""The model runs its memory-bound steps through the Triton kernels: a training forward and backward of a
small MoE model, once with every kernel run by Triton's interpreter (a child Python under
TRITON_INTERPRET=1, see `interpreted_kernels`), once here with the dispatchers' CPU paths, must agree;
the child also records which kernels ran, forward and backward.

Cases: fp32 (router, permute and unpermute, grouped GEMM, RMSNorm), and FP8 dispatch with the
fp8-emulated recipe's products (the blockwise FP8 quantiser and its inverse as well), run without the
recipe's bf16 autocast so that FP8's rounding is the only one: bf16 casts differ between compiled Triton
and its interpreter (which truncates), and FP8 rounding turns such last-bit differences into whole
e4m3 steps.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import torch.nn.functional as F
from interpreted_kernels import run_interpreted

from moe_dag.kernels import backend
from moe_dag.training.config import Config, ParallelConfig, PrecisionConfig, tiny
from moe_dag.training.distributed import DistInfo
from moe_dag.training.model import build_model
from moe_dag.training.parallelize import Parallelism
from moe_dag.training.precision import build_recipe

CASES = {
    "fp32": (PrecisionConfig(recipe="fp32"), ParallelConfig()),
    "fp8_dispatch_fp8_emulated": (
        PrecisionConfig(recipe="fp8-emulated", high_precision_edge_layers=0),
        ParallelConfig(fp8_dispatch=True),
    ),
}
# Each kernel's custom op, forward and backward (grouped GEMM: its backward op computes dw).
EXPECTED_OPS = {
    "fp32": {
        "moe_dag::route",
        "moe_dag::route_backward",
        "moe_dag::sort_by_expert",
        "moe_dag::scatter_rows",
        "moe_dag::gather_sum_rows",
        "moe_dag::unpermute_backward",
        "moe_dag::grouped_mm",
        "moe_dag::grouped_mm_weight_grad",
        "moe_dag::rms_norm_forward",
        "moe_dag::rms_norm_backward",
    },
}
EXPECTED_OPS["fp8_dispatch_fp8_emulated"] = EXPECTED_OPS["fp32"] | {
    "moe_dag::quantize_fp8_blockwise",
    "moe_dag::dequantize_fp8_blockwise",
}


def case_config(precision: PrecisionConfig, parallel: ParallelConfig) -> Config:
    config = tiny()
    model = dataclasses.replace(config.model, vocab_size=64, seq_len=16, n_layers=2, first_dense_layers=0)
    return dataclasses.replace(config, model=model, precision=precision, parallel=parallel)


def forward_backward(name: str) -> dict[str, object]:
    """One training forward and backward of the case's model on fixed tokens: loss, grads, ops run."""
    config = case_config(*CASES[name])
    info = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"))
    torch.manual_seed(0)
    model = build_model(config.model).train()
    Parallelism(config.parallel, info).shard_experts(model)
    recipe = build_recipe(config.precision)
    recipe.prepare(model)
    tokens = torch.randint(
        0, config.model.vocab_size, (2, config.model.seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
    ops = sorted({event.key for event in profile.key_averages() if event.key.startswith("moe_dag::")})
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach(), "logits": logits.detach(), "grads": grads, "ops": ops}


def run_kernels() -> dict[str, dict[str, object]]:
    assert backend.INTERPRETED, "the child must start with TRITON_INTERPRET=1"
    return {name: forward_backward(name) for name in CASES}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, dict[str, object]]:
    return run_interpreted(__file__, tmp_path_factory.mktemp("kernels_in_model"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_model_through_the_triton_kernels_equals_its_cpu_path(interpreted, name: str) -> None:
    kernels, cpu = interpreted[name], forward_backward(name)
    assert set(kernels["ops"]) >= EXPECTED_OPS[name]
    assert not cpu["ops"]  # here every dispatcher took its CPU path
    # fp32 sums in another order; the blockwise FP8 rounding is bit-exact between kernel and reference.
    tolerance = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(kernels["loss"], cpu["loss"], **tolerance)
    torch.testing.assert_close(kernels["logits"], cpu["logits"], **tolerance)
    assert kernels["grads"].keys() == cpu["grads"].keys()
    for parameter, grad in cpu["grads"].items():
        error = (kernels["grads"][parameter] - grad).norm() / grad.norm().clamp_min(1e-12)
        assert error < 1e-4, parameter


if __name__ == "__main__":
    torch.save(run_kernels(), sys.argv[1])
