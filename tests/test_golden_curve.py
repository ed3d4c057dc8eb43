"""The golden loss curve: the demo preset's first 30 steps from seed 0, on a synthetic token stream
the test builds itself, must reproduce the stored curve. A refactor that changes the numbers fails
here; one that means to change them regenerates the file and says why in its commit:

    MOE_DAG_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_curve.py

Tolerance: 2e-3 absolute per step (the losses start near ln 4096 = 8.3). One thread, fp32 and the
same seed make the run deterministic on one machine; the tolerance absorbs the last-bit differences
of another CPU's matrix kernels, which grow a little over 30 steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from moe_dag.training.config import preset
from moe_dag.training.synthetic import train_on_synthetic

GOLDEN = Path(__file__).parent / "golden" / "demo_loss_curve.json"
STEPS, BATCH, SEQ_LEN, TOLERANCE = 30, 4, 64, 2e-3


def demo_losses() -> list[float]:
    config = preset("demo")
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, seq_len=SEQ_LEN),
        train=dataclasses.replace(config.train, steps=STEPS, batch_size=BATCH, seed=0),
    )
    return train_on_synthetic(config, STEPS)


def test_demo_preset_reproduces_its_golden_loss_curve() -> None:
    assert torch.get_num_threads() == 1  # set in conftest.py: thread count changes reduction order
    losses = demo_losses()
    if os.environ.get("MOE_DAG_UPDATE_GOLDEN"):
        GOLDEN.write_text(
            json.dumps({"steps": STEPS, "batch_size": BATCH, "seq_len": SEQ_LEN, "losses": losses})
        )
    golden = json.loads(GOLDEN.read_text())
    assert (golden["steps"], golden["batch_size"], golden["seq_len"]) == (STEPS, BATCH, SEQ_LEN)
    assert sum(losses[-5:]) / 5 < losses[0] - 0.05  # a learning curve (warmup is 30 steps), not flat
    assert losses == pytest.approx(golden["losses"], abs=TOLERANCE)
