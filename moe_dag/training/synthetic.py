"""A deterministic synthetic token stream with learnable structure, and in-process training on it,
for tests and benchmarks that must not depend on a tokenized corpus (the golden loss curve, the
precision comparisons).

Tokens follow a random sparse Markov chain: each token has 4 successors, taken with probabilities
0.6, 0.2, 0.1, 0.1, and with probability 0.05 any token follows instead. The best possible loss is
about 1.4 nats per token, far below the ln(V) a model starts at, so curves fall for many steps.
Batch i is a pure function of (seed, i): the same on every machine and after any restart.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from moe_dag.training.config import Config
from moe_dag.training.load_balance import ExpertBiasUpdater
from moe_dag.training.model import build_model
from moe_dag.training.optim import build_optimizer, build_scheduler
from moe_dag.training.precision import build_recipe

_SUCCESSOR_PROBABILITIES = np.array([0.6, 0.2, 0.1, 0.1])
_NOISE = 0.05


class SyntheticBatches:
    """(inputs_BS, targets_BS) int64 batches, the `next_batch` interface of `data.TrainBatches`."""

    def __init__(self, vocab_size: int, seq_len: int, *, batch_size: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.batch_size, self.seed = vocab_size, seq_len, batch_size, seed
        table_rng = np.random.default_rng([seed, 0])
        self.successors_V4 = table_rng.integers(0, vocab_size, size=(vocab_size, 4))
        self.consumed = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, 1, self.consumed])
        self.consumed += 1
        B, S = self.batch_size, self.seq_len + 1
        tokens_BS = np.empty((B, S), dtype=np.int64)
        tokens_BS[:, 0] = rng.integers(0, self.vocab_size, size=B)
        choice_BS = rng.choice(4, size=(B, S), p=_SUCCESSOR_PROBABILITIES)
        noise_BS = rng.random((B, S)) < _NOISE
        random_BS = rng.integers(0, self.vocab_size, size=(B, S))
        for t in range(1, S):
            following = self.successors_V4[tokens_BS[:, t - 1], choice_BS[:, t]]
            tokens_BS[:, t] = np.where(noise_BS[:, t], random_BS[:, t], following)
        batch_BS = torch.from_numpy(tokens_BS)
        return batch_BS[:, :-1], batch_BS[:, 1:]


def train_on_synthetic(
    config: Config,
    steps: int,
    device: torch.device | None = None,
    step_seconds: list[float] | None = None,
) -> list[float]:
    """Train `config` from its seed on the synthetic stream for `steps` steps, in this process,
    with the trainer's own step (precision recipe, optimizer, bias balancing); the losses.

    `step_seconds`, when given, receives each step's wall time (the loss read back ends the step)."""
    from moe_dag.training.trainer import train_step  # the trainer imports the data room's readers

    device = device or torch.device("cpu")
    torch.manual_seed(config.train.seed)
    model = build_model(config.model, device)
    recipe = build_recipe(config.precision)
    recipe.prepare(model)
    optimizer = build_optimizer(model, config.optim)
    ExpertBiasUpdater(model.moe_layers(), config.optim.expert_bias_update_rate).register(optimizer)
    scheduler = build_scheduler(optimizer, steps, config.optim)
    batches = SyntheticBatches(
        config.model.vocab_size,
        config.model.seq_len,
        batch_size=config.train.batch_size,
        seed=config.train.seed,
    )
    losses = []
    for _ in range(steps):
        started = time.perf_counter()
        losses.append(train_step(model, optimizer, scheduler, batches, config, device, recipe)[0])
        if step_seconds is not None:
            step_seconds.append(time.perf_counter() - started)
    return losses
