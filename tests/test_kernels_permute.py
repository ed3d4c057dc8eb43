"""Permute and unpermute: the Triton kernels, run by Triton's interpreter on CPU, against the references.

The kernels run in a child Python under TRITON_INTERPRET=1 (this file run as a script, see
`interpreted_kernels`); the assertions run here.
"""

import sys

import pytest
import torch
from interpreted_kernels import run_interpreted

from moe_dag.kernels import backend, grouped_mm, route
from moe_dag.kernels.permute import permute, permute_reference, unpermute, unpermute_reference

# tokens, width, experts, top k, dtype: widths that are not a multiple of the block, a top k that is
# not a power of two, k = 1, experts that receive no token, and more than one block of pairs (E = 64:
# 128 pairs a block).
CASES = {
    "n13_d40_e5_k2": (13, 40, 5, 2, torch.float32),
    "n9_d70_e16_k3_bf16": (9, 70, 16, 3, torch.bfloat16),
    "n6_d16_e4_k1": (6, 16, 4, 1, torch.float32),
    "n40_d8_e64_k4": (40, 8, 64, 4, torch.float32),
}
# bf16 results are float32 maths cast once to bf16. Compiled Triton rounds that cast to nearest (half an
# ulp, 2^-8 relative), but the interpreter truncates, so the bound here is one ulp: 2^-7 relative.
TOLERANCES = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2**-7, "atol": 1e-5}}
# Experts that no token picks: the ids are drawn from the first half only.
UNUSED_EXPERTS_CASE = "n9_d70_e16_k3_bf16"


def routing(N: int, E: int, K: int, used_experts: int) -> torch.Tensor:
    """K distinct experts per token, drawn from the first `used_experts`."""
    return torch.stack([torch.randperm(used_experts)[:K] for _ in range(N)])


def run_kernels() -> dict[str, dict[str, torch.Tensor]]:
    """In the child: permute, a stand-in expert, unpermute, backward, for every case; then the ops."""
    assert backend.INTERPRETED, "the child must start with TRITON_INTERPRET=1"
    torch.manual_seed(0)
    cases = {}
    for name, (N, D, E, K, dtype) in CASES.items():
        expert = routing(N, E, K, E // 2 if name == UNUSED_EXPERTS_CASE else E)
        x = torch.randn(N, D).to(dtype).requires_grad_()
        gate = torch.rand(N, K).requires_grad_()
        scale_MD = torch.randn(N * K, D).to(dtype)  # a stand-in expert: a different scale per sorted row
        x_MD, counts, row = permute(x, expert, E)
        y_MD = x_MD * scale_MD
        x_MD.retain_grad()
        y_MD.retain_grad()
        y = unpermute(y_MD, row, gate)
        dy = torch.randn_like(y)
        y.backward(dy)
        cases[name] = {
            "expert": expert, "x": x.detach(), "gate": gate.detach(), "dy": dy, "x_MD": x_MD.detach(),
            "y_MD": y_MD.detach(), "counts": counts, "row": row, "y": y.detach(), "dx": x.grad,
            "dgate": gate.grad, "dx_MD": x_MD.grad, "dy_MD": y_MD.grad,
        }  # fmt: skip

    # Gates that need no gradient: backward takes the gated scatter alone.
    x, gate = torch.randn(5, 8, requires_grad=True), torch.rand(5, 2, requires_grad=True)
    expert = routing(5, 4, 2, 4)
    row, _ = torch.ops.moe_dag.sort_by_expert(expert, 4)
    y_MD, dy = torch.randn(10, 8, requires_grad=True), torch.randn(5, 8)
    unpermute(y_MD, row, gate.detach()).backward(dy)
    cases["fixed_gates"] = {
        "y_MD": y_MD.detach(),
        "row": row,
        "gate": gate.detach(),
        "dy": dy,
        "dy_MD": y_MD.grad,
    }

    y_MD = torch.randn(10, 8, requires_grad=True)
    torch.library.opcheck(torch.ops.moe_dag.sort_by_expert.default, (expert, 4))
    torch.library.opcheck(torch.ops.moe_dag.scatter_rows.default, (x, row, None))
    torch.library.opcheck(torch.ops.moe_dag.scatter_rows.default, (x, row, gate.detach()))
    torch.library.opcheck(torch.ops.moe_dag.gather_sum_rows.default, (y_MD, row, gate))
    torch.library.opcheck(torch.ops.moe_dag.gather_sum_rows.default, (y_MD, row, None))
    backward_args = (torch.randn(5, 8), y_MD.detach(), row, gate.detach())
    torch.library.opcheck(torch.ops.moe_dag.unpermute_backward.default, backward_args)
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    return run_interpreted(__file__, tmp_path_factory.mktemp("permute"))


@pytest.mark.parametrize("name", CASES)
def test_triton_permute_matches_reference_exactly(interpreted, name):
    case = interpreted[name]
    x_MD, counts, row = permute_reference(case["x"], case["expert"], CASES[name][2])
    assert torch.equal(case["row"], row) and torch.equal(case["counts"], counts)
    assert torch.equal(case["x_MD"], x_MD)  # a copy: bit for bit
    assert case["row"].dtype == case["counts"].dtype == torch.int32


@pytest.mark.parametrize("name", CASES)
def test_triton_unpermute_forward_and_backward_match_float64(interpreted, name):
    case = interpreted[name]
    y_MD = case["y_MD"].double().requires_grad_()
    gate = case["gate"].double().requires_grad_()
    y = unpermute_reference(y_MD, case["row"], gate)
    y.backward(case["dy"].double())

    tolerance = TOLERANCES[case["x"].dtype]
    assert case["y"].dtype == case["x"].dtype and case["dgate"].dtype == case["gate"].dtype
    torch.testing.assert_close(case["y"].double(), y.detach(), **tolerance)
    torch.testing.assert_close(case["dy_MD"].double(), y_MD.grad, **tolerance)
    torch.testing.assert_close(case["dgate"].double(), gate.grad, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("name", CASES)
def test_triton_permute_backward_sums_each_tokens_rows(interpreted, name):
    case = interpreted[name]
    x = case["x"].double().requires_grad_()
    permute_reference(x, case["expert"], CASES[name][2])[0].backward(case["dx_MD"].double())
    torch.testing.assert_close(case["dx"].double(), x.grad, **TOLERANCES[case["x"].dtype])


def test_unpermute_backward_without_gate_gradients(interpreted):
    case = interpreted["fixed_gates"]
    y_MD = case["y_MD"].double().requires_grad_()
    unpermute_reference(y_MD, case["row"], case["gate"].double()).backward(case["dy"].double())
    torch.testing.assert_close(case["dy_MD"].double(), y_MD.grad, **TOLERANCES[torch.float32])


def test_experts_without_tokens_get_empty_slices(interpreted):
    case = interpreted[UNUSED_EXPERTS_CASE]
    E = CASES[UNUSED_EXPERTS_CASE][2]
    assert (case["counts"][E // 2 :] == 0).all() and case["counts"].sum() == case["row"].numel()


def test_permute_groups_rows_by_expert_in_token_order():
    expert = torch.tensor([[2, 0], [0, 1], [2, 1]])
    x = torch.arange(3.0)[:, None].expand(3, 4)
    x_MD, counts, row = permute_reference(x, expert, 4)
    assert x_MD[:, 0].tolist() == [0.0, 1.0, 1.0, 2.0, 0.0, 2.0]  # expert 0: tokens 0, 1; 1: 1, 2; 2: 0, 2
    assert counts.tolist() == [2, 2, 2, 0]
    assert row.tolist() == [[4, 0], [1, 2], [5, 3]]


def test_unpermute_reference_matches_autograd_of_the_plain_expression():
    x, expert = torch.randn(9, 12, dtype=torch.float64), routing(9, 5, 3, 5)
    _, _, row = permute_reference(x, expert, 5)
    y_MD = torch.randn(27, 12, dtype=torch.float64, requires_grad=True)
    gate = torch.rand(9, 3, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(9, 12, dtype=torch.float64)
    expected = (y_MD[row.long()] * gate[..., None]).sum(1)
    expected_grads = torch.autograd.grad(expected, (y_MD, gate), dy)

    got = unpermute_reference(y_MD, row, gate)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for grad, expected_grad in zip(torch.autograd.grad(got, (y_MD, gate), dy), expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda y, g: unpermute_reference(y, row, g), (y_MD, gate))


def test_unpermute_rejects_rows_that_are_not_one_per_pair():
    with pytest.raises(ValueError, match="one sorted row per"):
        unpermute_reference(torch.randn(5, 4), torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 2))


def test_unpermute_with_gates_summing_to_one_restores_the_tokens():
    x, expert = torch.randn(7, 12), routing(7, 5, 3, 5)
    gate = torch.softmax(torch.randn(7, 3), dim=-1)
    x_MD, _, row = permute_reference(x, expert, 5)
    torch.testing.assert_close(unpermute_reference(x_MD, row, gate), x)


@pytest.mark.skipif(backend.INTERPRETED, reason="TRITON_INTERPRET=1 routes CPU tensors to Triton")
def test_cpu_tensors_use_the_reference_when_not_interpreted():
    x, expert, gate = torch.randn(6, 8), routing(6, 4, 2, 4), torch.rand(6, 2)
    x_MD, counts, row = permute(x, expert, 4)
    expected = permute_reference(x, expert, 4)
    assert all(torch.equal(a, b) for a, b in zip((x_MD, counts, row), expected, strict=True))
    assert torch.equal(unpermute(x_MD, row, gate), unpermute_reference(x_MD, row, gate))


def test_a_layer_call_without_tokens_passes_through_every_dispatcher():
    # An expert-parallel rank can receive no tokens at all; every step must still run, forward and back.
    logits, x = torch.randn(0, 4, requires_grad=True), torch.randn(0, 8, requires_grad=True)
    w = torch.randn(4, 8, 8, requires_grad=True)
    expert, gate, counts = route(logits, torch.zeros(4), 2, "softmax")
    x_MD, _, row = permute(x, expert, 4)
    y = unpermute(grouped_mm(x_MD, w, counts.cumsum(0, dtype=torch.int32)), row, gate)
    y.sum().backward()
    assert y.shape == (0, 8) and counts.tolist() == [0, 0, 0, 0]
    assert x.grad.shape == (0, 8) and (w.grad == 0).all()


def test_bad_shapes_are_value_errors():
    with pytest.raises(
        ValueError, match=r"x of shape \(N, D\) and expert ids of shape \(N, K\), got x \(4, 8\)"
    ):
        permute(torch.randn(4, 8), torch.zeros(5, 2, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="integer expert ids, got torch.float32"):
        permute(torch.randn(4, 8), torch.zeros(4, 2), 4)
    with pytest.raises(ValueError, match=r"gates shaped like row_NK \(4, 2\), got \(4, 3\)"):
        unpermute(torch.randn(8, 8), torch.zeros(4, 2, dtype=torch.int32), torch.rand(4, 3))


if __name__ == "__main__":
    torch.save(run_kernels(), sys.argv[1])
