"""The MoE layer: routing, the expert-selection bias, dispatch, token counts, load-balancing hook."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from moe_dag.training.config import ModelConfig, tiny
from moe_dag.training.load_balance import ExpertBiasUpdater
from moe_dag.training.model import build_model
from moe_dag.training.moe import MoE, Router


def moe_config(**changes: object) -> ModelConfig:
    return dataclasses.replace(tiny().model, **{"num_experts": 8, "top_k": 2, **changes})


def built_moe(config: ModelConfig, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    model = build_model(dataclasses.replace(config, first_dense_layers=0, n_layers=1))
    return model.moe_layers()[0]


@pytest.mark.parametrize("score", ["sigmoid", "softmax"])
def test_router_picks_k_distinct_experts_with_normalised_gates(score: str) -> None:
    moe = built_moe(moe_config(router_score=score))
    expert_NK, gate_NK = moe.router(torch.randn(64, moe.router.gate.in_features))
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
    expert_NK, gate_NK = router(x_ND)
    assert (expert_NK[:, 0] == 3).all()
    chosen_NK = scores_NE.gather(-1, expert_NK)
    torch.testing.assert_close(gate_NK, chosen_NK / chosen_NK.sum(dim=-1, keepdim=True))

    router.expert_bias_E.zero_()
    unbiased_NK, _ = router(x_ND)
    assert not torch.equal(unbiased_NK, expert_NK)


def test_reference_dispatch_equals_per_token_sum_of_experts() -> None:
    moe = built_moe(moe_config()).double()
    experts = moe.experts
    x_ND = torch.randn(40, experts.w1_EFD.shape[2], dtype=torch.float64)
    expert_NK, gate_NK = moe.router(x_ND)
    expected = torch.zeros_like(x_ND)
    for n in range(x_ND.shape[0]):
        for k in range(expert_NK.shape[1]):
            e = expert_NK[n, k]
            hidden = F.silu(experts.w1_EFD[e] @ x_ND[n]) * (experts.w3_EFD[e] @ x_ND[n])
            expected[n] += gate_NK[n, k] * (experts.w2_EDF[e] @ hidden)
    torch.testing.assert_close(experts(x_ND, expert_NK, gate_NK), expected)


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
