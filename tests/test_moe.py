"""The MoE layer: routing, the expert-selection bias, grouped dispatch against the per-expert loop,
router losses, the capacity limit, token counts, the load-balancing hook."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from moe_dag.training.config import ModelConfig, tiny
from moe_dag.training.grouped_mm import grouped_mm, looped_grouped_mm, padded_grouped_mm
from moe_dag.training.load_balance import ExpertBiasUpdater
from moe_dag.training.model import build_model
from moe_dag.training.moe import (
    MoE,
    Router,
    drop_over_capacity,
    router_z_loss,
    sequence_balance_loss,
    swiglu_fused,
)


def moe_config(**changes: object) -> ModelConfig:
    return dataclasses.replace(tiny().model, **{"num_experts": 8, "top_k": 2, **changes})


def built_moe(config: ModelConfig, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    model = build_model(dataclasses.replace(config, first_dense_layers=0, n_layers=1))
    return model.moe_layers()[0]


@pytest.mark.parametrize("score", ["sigmoid", "softmax"])
def test_router_picks_k_distinct_experts_with_normalised_gates(score: str) -> None:
    moe = built_moe(moe_config(router_score=score))
    routed = moe.router(torch.randn(64, moe.router.gate.in_features))
    expert_NK, gate_NK = routed.expert_NK, routed.gate_NK
    assert gate_NK.dtype == torch.float32
    assert expert_NK.shape == gate_NK.shape == (64, 2)
    assert (expert_NK[:, 0] != expert_NK[:, 1]).all()
    assert (gate_NK > 0).all()
    torch.testing.assert_close(gate_NK.sum(dim=-1), torch.ones(64))


@pytest.mark.parametrize("score", ["sigmoid", "softmax"])
def test_bias_changes_selection_but_not_gate_values(score: str) -> None:
    router: Router = built_moe(moe_config(router_score=score)).router
    x_ND = torch.randn(32, router.gate.in_features)
    logits_NE = router.gate(x_ND)
    scores_NE = logits_NE.sigmoid() if score == "sigmoid" else logits_NE.softmax(dim=-1)

    router.expert_bias_E[3] = 10.0  # expert 3 wins every token's first slot
    expert_NK, gate_NK = router(x_ND).expert_NK, router(x_ND).gate_NK
    assert (expert_NK[:, 0] == 3).all()
    chosen_NK = scores_NE.gather(-1, expert_NK)
    torch.testing.assert_close(gate_NK, chosen_NK / chosen_NK.sum(dim=-1, keepdim=True))

    router.expert_bias_E.zero_()
    unbiased_NK = router(x_ND).expert_NK
    assert not torch.equal(unbiased_NK, expert_NK)


def test_reference_dispatch_equals_per_token_sum_of_experts() -> None:
    moe = built_moe(moe_config()).double()
    experts = moe.experts
    x_ND = torch.randn(40, experts.w1_EFD.shape[2], dtype=torch.float64)
    routed = moe.router(x_ND)
    expert_NK, gate_NK = routed.expert_NK, routed.gate_NK.double()
    expected = torch.zeros_like(x_ND)
    for n in range(x_ND.shape[0]):
        for k in range(expert_NK.shape[1]):
            e = expert_NK[n, k]
            hidden = F.silu(experts.w1_EFD[e] @ x_ND[n]) * (experts.w3_EFD[e] @ x_ND[n])
            expected[n] += gate_NK[n, k] * (experts.w2_EDF[e] @ hidden)
    torch.testing.assert_close(moe.dispatch(experts, x_ND, expert_NK, gate_NK), expected)


def test_layer_output_has_the_scale_of_the_pre_output_norm() -> None:
    moe = built_moe(moe_config())
    with torch.no_grad():
        moe.output_norm_scale.fill_(3.0)
        # Inputs large enough that the norm's eps is negligible next to the experts' output.
        y_BSD = moe(10 * torch.randn(2, 5, moe.router.gate.in_features))
    rms_BS = y_BSD.pow(2).mean(dim=-1).sqrt()
    torch.testing.assert_close(rms_BS, torch.full((2, 5), 3.0), rtol=1e-4, atol=1e-4)


def test_gradients_reach_router_and_experts_but_never_the_bias() -> None:
    moe = built_moe(moe_config())
    moe(torch.randn(2, 6, moe.router.gate.in_features)).square().sum().backward()
    for parameter in (
        moe.router.gate.weight,
        moe.experts.w1_EFD,
        moe.shared.w2.weight,
        moe.output_norm_scale,
    ):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    assert "expert_bias_E" not in dict(moe.named_parameters())


def test_tokens_are_counted_in_training_only() -> None:
    moe = built_moe(moe_config())
    x = torch.randn(3, 7, moe.router.gate.in_features)
    with torch.no_grad():
        moe.eval()(x)
        assert moe.tokens_per_expert_E.sum() == 0
        moe.train()(x)
        moe.train()(x)
    assert moe.tokens_per_expert_E.sum() == 2 * 3 * 7 * 2  # two forwards of 21 tokens, top-2


def test_bias_update_moves_towards_balance_by_the_rate() -> None:
    moe = built_moe(moe_config(num_experts=4))
    moe.tokens_per_expert_E.copy_(torch.tensor([10.0, 2.0, 2.0, 2.0]))  # mean 4
    updater = ExpertBiasUpdater([moe], rate=0.01)
    updater.update()
    torch.testing.assert_close(moe.router.expert_bias_E, torch.tensor([-0.01, 0.01, 0.01, 0.01]))
    assert updater.imbalance == [pytest.approx(2.5)]
    assert moe.tokens_per_expert_E.sum() == 0


def test_optimizer_pre_step_hook_balances_a_skewed_router() -> None:
    moe = built_moe(moe_config())
    with torch.no_grad():
        moe.router.gate.weight[0] += 0.1  # with positive inputs, expert 0 scores highest for all
    optimizer = torch.optim.SGD(moe.parameters(), lr=0.0)  # only the hook changes anything
    updater = ExpertBiasUpdater([moe], rate=0.005)
    updater.register(optimizer)
    x = torch.randn(4, 32, moe.router.gate.in_features) + 1.0
    imbalances = []
    moe.train()  # tokens are counted in training mode, with or without gradients
    for _ in range(120):
        with torch.no_grad():
            moe(x)
        optimizer.step()
        imbalances.append(updater.imbalance[0])
    assert imbalances[0] > 3.0  # 4.0 is every token sending one of its two picks to expert 0
    assert max(imbalances[-10:]) < 1.5
    assert moe.router.expert_bias_E[0] < 0


def skewed_stream_imbalance(rate: float, steps: int) -> list[float]:
    """Max/mean load per step on a stream of diverse tokens that all lean towards low-numbered
    experts (a shared input direction the router maps to skewed logits)."""
    moe = built_moe(moe_config())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weight = 0.2 * torch.randn(8, moe.router.gate.in_features, generator=generator)
        weight[:, 0] += torch.linspace(2.0, -2.0, 8)
        moe.router.gate.weight.copy_(weight)
    optimizer = torch.optim.SGD(moe.parameters(), lr=0.0)
    updater = ExpertBiasUpdater([moe], rate=rate)
    updater.register(optimizer)
    moe.train()
    imbalances = []
    for _ in range(steps):
        # 4096 tokens: 1024 pairs per expert, so sampling noise alone moves a load by about 3%.
        x = torch.randn(1, 4096, moe.router.gate.in_features, generator=generator)
        x[..., 0] = 1.0
        with torch.no_grad():
            moe(x)
        optimizer.step()
        imbalances.append(updater.imbalance[0])
    return imbalances


def test_bias_balancing_reaches_near_uniform_load_where_no_balancing_stays_skewed() -> None:
    unbalanced, balanced = skewed_stream_imbalance(0.0, 120), skewed_stream_imbalance(5e-3, 120)
    assert min(unbalanced) > 2.5  # of at most 4.0 = E / k
    assert balanced[0] > 2.5 and max(balanced[-20:]) < 1.2


@pytest.mark.parametrize("implementation", [grouped_mm, padded_grouped_mm])
def test_grouped_products_equal_the_per_expert_loop(implementation) -> None:
    torch.manual_seed(0)
    counts_E = torch.tensor([5, 0, 9, 1, 0, 7])  # experts without tokens included
    x_MK = torch.randn(int(counts_E.sum()), 12, dtype=torch.float64, requires_grad=True)
    w_ENK = torch.randn(6, 10, 12, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(x_MK.shape[0], 10, dtype=torch.float64)
    fast = implementation(x_MK, w_ENK, counts_E)
    fast_grads = torch.autograd.grad(fast, (x_MK, w_ENK), upstream)
    slow = looped_grouped_mm(x_MK, w_ENK, counts_E)
    slow_grads = torch.autograd.grad(slow, (x_MK, w_ENK), upstream)
    torch.testing.assert_close(fast, slow)
    for a, b in zip(fast_grads, slow_grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_swiglu_is_bitwise_autograd_of_the_plain_expression(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    h13 = torch.randn(37, 2 * 24, dtype=dtype, requires_grad=True)
    upstream = torch.randn(37, 24, dtype=dtype)
    h1, h3 = h13.chunk(2, dim=-1)
    expected = F.silu(h1) * h3
    (expected_grad,) = torch.autograd.grad(expected, h13, upstream)
    got = swiglu_fused(h13)
    (got_grad,) = torch.autograd.grad(got, h13, upstream)
    assert torch.equal(got, expected) and torch.equal(got_grad, expected_grad)


def test_moe_layer_grouped_equals_loop_forward_and_gradients() -> None:
    config = moe_config()
    grouped, looped = built_moe(config).double(), built_moe(config).double()
    looped.experts.grouped_mm = looped_grouped_mm
    x = torch.randn(3, 11, config.d_model, dtype=torch.float64)
    for moe in (grouped, looped):
        moe(x).square().sum().backward()
    torch.testing.assert_close(grouped(x), looped(x))
    for (name, a), b in zip(grouped.named_parameters(), looped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_sequence_balance_loss_by_hand() -> None:
    # One sequence of 2 tokens, 2 experts, k = 1: both tokens go to expert 0.
    affinity_BSE = torch.tensor([[[0.75, 0.25], [0.5, 0.5]]])
    expert_BSK = torch.tensor([[[0], [0]]])
    # f = E / (k S) x counts = [2, 0]; P = [0.625, 0.375]; sum f P = 1.25.
    assert sequence_balance_loss(affinity_BSE, expert_BSK).item() == pytest.approx(1.25)
    balanced = sequence_balance_loss(affinity_BSE, torch.tensor([[[0], [1]]]))
    assert balanced.item() == pytest.approx(0.625 + 0.375)


def test_router_z_loss_by_hand() -> None:
    logits_NE = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    expected = (torch.log(torch.tensor(2.0)) ** 2 + torch.logsumexp(torch.tensor([1.0, 2.0]), 0) ** 2) / 2
    torch.testing.assert_close(router_z_loss(logits_NE), expected)


def test_router_losses_reach_the_router_and_are_off_by_default() -> None:
    moe = built_moe(moe_config())
    moe.train()(torch.randn(2, 5, moe.router.gate.in_features))
    assert moe.router_loss is None
    moe = built_moe(moe_config(router_aux_loss_alpha=1e-4, router_z_loss_coef=1e-3))
    x = torch.randn(2, 5, moe.router.gate.in_features)
    moe.train()(x)
    routed = moe.router(x.view(10, -1))
    affinity = routed.affinity_NE.view(2, 5, -1)
    expected = 1e-4 * sequence_balance_loss(affinity, routed.expert_NK.view(2, 5, -1))
    expected = expected + 1e-3 * router_z_loss(routed.logits_NE)
    torch.testing.assert_close(moe.router_loss, expected)
    moe.router_loss.backward()
    assert moe.router.gate.weight.grad.abs().sum() > 0


def test_capacity_drops_pairs_past_each_experts_capacity_in_token_order() -> None:
    expert_NK = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])
    kept = drop_over_capacity(expert_NK, num_experts=4, capacity=2)
    assert kept.tolist() == [[0, 1], [0, 2], [4, 1], [3, 4]]  # 4 marks a dropped pair


def test_dropped_pairs_are_counted_and_contribute_nothing() -> None:
    config = moe_config(num_experts=4, capacity_factor=0.5)
    moe = built_moe(config).double()
    x = torch.randn(1, 16, config.d_model, dtype=torch.float64)
    moe.train()
    with torch.no_grad():
        moe(x)
    capacity = moe.capacity(16)
    assert capacity == 4  # 0.5 x 16 tokens x 2 / 4 experts
    assert moe.tokens_per_expert_E.max() <= capacity
    dropped = moe.router_stats[2].item()
    assert dropped == 16 * 2 - moe.tokens_per_expert_E.sum().item() > 0
    routed = moe.router(x.view(16, -1))
    expert_NK = drop_over_capacity(routed.expert_NK, 4, capacity)
    expected = torch.zeros(16, config.d_model, dtype=torch.float64)
    experts = moe.experts
    for n in range(16):
        for k in range(2):
            e = int(expert_NK[n, k])
            if e < 4:
                hidden = F.silu(experts.w1_EFD[e] @ x[0, n]) * (experts.w3_EFD[e] @ x[0, n])
                expected[n] += routed.gate_NK[n, k] * (experts.w2_EDF[e] @ hidden)
    torch.testing.assert_close(moe.dispatch(experts, x[0], expert_NK, routed.gate_NK), expected)


def test_router_math_stays_fp32_under_bf16_autocast() -> None:
    moe = built_moe(moe_config())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        routed = moe.router(torch.randn(8, moe.router.gate.in_features))
    assert routed.logits_NE.dtype == routed.gate_NK.dtype == torch.float32
