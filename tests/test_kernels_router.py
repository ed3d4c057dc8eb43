"""The fused router: the Triton kernels, run by Triton's interpreter on CPU, against a float64 reference.

The kernels run in a child Python under TRITON_INTERPRET=1 (this file run as a script, see
`interpreted_kernels`); the assertions run here.
"""

import sys

import pytest
import torch
from interpreted_kernels import run_interpreted

from moe_dag.kernels import backend
from moe_dag.kernels.router import route, route_reference

# tokens, experts, top k, logits dtype: a row count that is not a multiple of the block, a top k that
# is not a power of two, k = E, and bf16 logits as a bf16 gate projection would give.
SHAPES = {
    "n37_e8_k2": (37, 8, 2, torch.float32),
    "n9_e64_k6_bf16": (9, 64, 6, torch.bfloat16),
    "n5_e6_k6": (5, 6, 6, torch.float32),
}
CASES = [(shape, score) for shape in SHAPES for score in ("sigmoid", "softmax")]


def run_kernels() -> dict[str, dict[str, torch.Tensor]]:
    """In the child: every case forward and backward through the Triton op, then check the ops."""
    assert backend.INTERPRETED, "the child must start with TRITON_INTERPRET=1"
    torch.manual_seed(0)
    cases = {}
    for shape, score in CASES:
        N, E, K, dtype = SHAPES[shape]
        logits = torch.randn(N, E).to(dtype).requires_grad_()
        bias = 0.05 * torch.randn(E)
        expert, gate, counts = route(logits, bias, K, score)
        dgate = torch.randn_like(gate)
        gate.backward(dgate)
        cases[f"{shape}_{score}"] = {
            "logits": logits.detach(), "bias": bias, "dgate": dgate, "expert": expert, "gate": gate.detach(),
            "counts": counts, "dlogits": logits.grad,
        }  # fmt: skip
    # A bias far above every score: its expert is chosen by every token, with its unbiased gate.
    logits, bias = torch.randn(11, 8), torch.zeros(8)
    bias[5] = 10.0
    cases["dominant_bias"] = dict(
        zip(("expert", "gate", "counts"), route(logits, bias, 2, "sigmoid"), strict=True)
    )
    cases["dominant_bias"] |= {"logits": logits, "bias": bias}

    logits, bias = torch.randn(6, 8, requires_grad=True), torch.randn(8)
    for score in ("sigmoid", "softmax"):
        torch.library.opcheck(torch.ops.moe_dag.route.default, (logits, bias, 3, score))
        expert, gate, _ = route(logits.detach(), bias, 3, score)
        backward_args = (torch.randn(6, 3), gate, expert, logits.detach(), score)
        torch.library.opcheck(torch.ops.moe_dag.route_backward.default, backward_args)
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    return run_interpreted(__file__, tmp_path_factory.mktemp("router"))


@pytest.mark.parametrize(("shape", "score"), CASES)
def test_triton_router_matches_float64_reference(interpreted, shape, score):
    case = interpreted[f"{shape}_{score}"]
    logits = case["logits"].double().requires_grad_()
    expert, gate, counts = route_reference(logits, case["bias"].double(), SHAPES[shape][2], score)
    gate.backward(case["dgate"].double())

    assert torch.equal(case["expert"], expert)
    assert torch.equal(case["counts"], counts)
    assert case["gate"].dtype == torch.float32 and case["dlogits"].dtype == case["logits"].dtype
    torch.testing.assert_close(case["gate"].double(), gate.detach(), rtol=1e-5, atol=1e-6)
    # bf16 gradients are float32 maths cast once to bf16 (the interpreter truncates: one ulp).
    tolerance = {"rtol": 2**-7, "atol": 1e-5} if case["logits"].dtype == torch.bfloat16 else {}
    torch.testing.assert_close(case["dlogits"].double(), logits.grad, **tolerance)


def test_bias_chooses_experts_but_gates_come_from_scores_alone(interpreted):
    case = interpreted["dominant_bias"]
    assert (case["expert"][:, 0] == 5).all()
    assert case["counts"][5] == 11 and case["counts"].sum() == 22
    scores = torch.sigmoid(case["logits"]).gather(1, case["expert"])
    torch.testing.assert_close(case["gate"], scores / scores.sum(1, keepdim=True))


def test_reference_on_a_worked_example():
    # sigmoid(0) = 0.5, sigmoid(ln 3) = 0.75; the bias lifts expert 0 over expert 2 for the choice only.
    logits = torch.tensor([[0.0, torch.log(torch.tensor(3.0)).item(), 0.1, -5.0]])
    bias = torch.tensor([0.1, 0.0, 0.0, 0.0])
    expert, gate, counts = route_reference(logits, bias, 2, "sigmoid")
    assert expert.tolist() == [[1, 0]]
    torch.testing.assert_close(gate, torch.tensor([[0.6, 0.4]]))
    assert counts.tolist() == [1, 1, 0, 0] and counts.dtype == torch.int32


@pytest.mark.skipif(backend.INTERPRETED, reason="TRITON_INTERPRET=1 routes CPU tensors to Triton")
def test_cpu_tensors_use_the_reference_when_not_interpreted():
    logits, bias = torch.randn(5, 8), torch.randn(8)
    for got, expected in zip(
        route(logits, bias, 2, "softmax"), route_reference(logits, bias, 2, "softmax"), strict=True
    ):
        assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("logits_shape", "bias_shape", "top_k", "score", "message"),
    [
        ((4, 8), (8,), 9, "sigmoid", r"top_k in 1..8 \(the number of experts\), got 9"),
        ((4, 8), (8,), 0, "sigmoid", r"top_k in 1..8"),
        ((4, 8), (7,), 2, "sigmoid", r"bias of shape \(8,\) for 8 experts, got \(7,\)"),
        ((4, 8), (8,), 2, "relu", r"score_fn must be one of \('sigmoid', 'softmax'\), got 'relu'"),
        ((2, 4, 8), (8,), 2, "sigmoid", r"logits of shape \(N, E\), got \(2, 4, 8\)"),
    ],
)
def test_bad_arguments_are_value_errors(logits_shape, bias_shape, top_k, score, message):
    with pytest.raises(ValueError, match=message):
        route(torch.randn(logits_shape), torch.zeros(bias_shape), top_k, score)


if __name__ == "__main__":
    torch.save(run_kernels(), sys.argv[1])
