"""Run health: router statistics per MoE layer, dead experts, NaN and loss-spike detection."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from moe_dag.training.config import HealthConfig, PrecisionConfig, tiny
from moe_dag.training.health import AnomalyDetector, RouterHealth, TrainingAnomaly
from moe_dag.training.load_balance import ExpertBiasUpdater
from moe_dag.training.model import build_model
from moe_dag.training.optim import build_optimizer, build_scheduler
from moe_dag.training.precision import build_recipe
from moe_dag.training.synthetic import SyntheticBatches
from moe_dag.training.trainer import train_step


def tiny_run(health: HealthConfig, n_layers: int = 3):
    config = tiny()
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, n_layers=n_layers), health=health
    )
    torch.manual_seed(0)
    model = build_model(config.model)
    optimizer = build_optimizer(model, config.optim)
    balancer = ExpertBiasUpdater(model.moe_layers(), config.optim.expert_bias_update_rate)
    balancer.register(optimizer)
    scheduler = build_scheduler(optimizer, 100, config.optim)
    batches = SyntheticBatches(config.model.vocab_size, config.model.seq_len, batch_size=4, seed=0)
    recipe = build_recipe(PrecisionConfig())

    def step(number: int, detector: AnomalyDetector) -> float:
        return train_step(
            model, optimizer, scheduler, batches, config, torch.device("cpu"), recipe, detector, step=number
        )[0]

    return model, balancer, step


def test_injected_nan_stops_the_run_naming_step_and_layer() -> None:
    model, _, step = tiny_run(HealthConfig(stop_on="nan"))
    detector = AnomalyDetector(HealthConfig(stop_on="nan"))
    for number in (1, 2):
        step(number, detector)
    with torch.no_grad():
        model.layers[2].attn.wv.weight[0, 0] = float("nan")
    before = model.layers[1].ffn.experts.w1_EFD.detach().clone()
    with pytest.raises(
        TrainingAnomaly,
        match=r"step 3: loss is nan \(first non-finite weight: layers.2.attn.wv.weight\); "
        r"stopping the run \(health.stop_on=nan\)",
    ):
        step(3, detector)
    # Stopped before the optimizer step: the weights of the other layers are untouched.
    assert torch.equal(model.layers[1].ffn.experts.w1_EFD, before)


def test_nan_is_reported_but_not_fatal_when_configured(caplog: pytest.LogCaptureFixture) -> None:
    model, _, step = tiny_run(HealthConfig(stop_on="never"))
    detector = AnomalyDetector(HealthConfig(stop_on="never"))
    # An activation overflow in block 0's attention, with every weight still finite.
    model.layers[0].attn.register_forward_hook(lambda module, inputs, output: output * float("nan"))
    with caplog.at_level(logging.WARNING):
        step(1, detector)
    assert "step 1: loss is nan" in caplog.text and "continuing" in caplog.text
    assert "router saw non-finite inputs: layer 1" in caplog.text  # the first MoE layer after it


def test_loss_spike_above_the_factor_of_the_running_mean() -> None:
    detector = AnomalyDetector(
        HealthConfig(spike_factor=2.0, spike_window=5, spike_min_steps=3, stop_on="nan_or_spike")
    )
    model = build_model(tiny().model)
    for number, loss in enumerate([4.0, 4.2, 3.8, 4.0], start=1):
        detector.check(number, loss, model)
    detector.check(5, 7.9, model)  # below 2 x 4.0
    with pytest.raises(
        TrainingAnomaly,
        match=r"step 6: loss spike 12.0000 > 2.0 x running mean .* \(largest "
        r"gradient: no gradients\)",
    ):
        detector.check(6, 12.0, model)


def test_router_health_reports_every_moe_layer() -> None:
    model, balancer, step = tiny_run(HealthConfig(dead_expert_window=3))
    health = RouterHealth(model, HealthConfig(dead_expert_window=3))
    detector = AnomalyDetector(HealthConfig())
    step(1, detector)
    record = health.observe(balancer.load_LE)
    assert record["layers"] == [1, 2]
    assert [sum(load) for load in record["load"]] == [4 * 32 * 2] * 2  # tokens x top-k per layer
    assert all(1.0 <= value <= 2.0 for value in record["max_over_mean"])
    assert all(0 < value <= torch.log(torch.tensor(4.0)).item() + 1e-6 for value in record["entropy"])
    assert record["dropped_fraction"] == [0.0, 0.0] and record["nonfinite_tokens"] == [0.0, 0.0]
    assert all(low <= high for low, high in zip(record["bias_min"], record["bias_max"], strict=True))
    assert model.moe_layers()[0].router_stats.sum() == 0  # read and reset


def test_an_expert_without_tokens_for_the_whole_window_is_dead() -> None:
    model = build_model(tiny().model)
    health = RouterHealth(model, HealthConfig(dead_expert_window=3))
    assert health.observe(torch.tensor([[5.0, 0.0, 3.0, 0.0]]))["dead_experts"] == [2]
    assert health.observe(torch.tensor([[5.0, 1.0, 3.0, 0.0]]))["dead_experts"] == [1]
    for _ in range(3):
        record = health.observe(torch.tensor([[5.0, 0.0, 3.0, 2.0]]))
    assert record["dead_experts"] == [1]  # expert 3 came back; expert 1's token left the window
