"""Data stream, optimizer set-up, the training loop, checkpoints, exact resume and the command line."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from moe_dag.training.checkpoint import list_checkpoints
from moe_dag.training.config import Config, apply_overrides, tiny
from moe_dag.training.data import TrainBatches
from moe_dag.training.tracking import resolve_mode
from moe_dag.training.trainer import train

SEQ_LEN, VOCAB, EOS = 32, 64, 0


def write_mixture(data_dir: Path, rows: np.ndarray, dtype: type = np.uint16) -> Path:
    """A tokenized mixture directory in the data room's layout."""
    data_dir.mkdir(parents=True, exist_ok=True)
    np.save(data_dir / "train.npy", rows.astype(dtype))
    meta = {"seq_len": rows.shape[1] - 1, "vocab_size": VOCAB, "eos_id": EOS, "num_sequences": rows.shape[0]}
    (data_dir / "mixture.json").write_text(json.dumps(meta))
    documents = [[5, 6, 7, EOS], [9, 10, 11, 12, 13, EOS]]
    heldout = {
        "source": ["web", "code"],
        "id": ["w0", "c0"],
        "tokens": pa.array(documents, pa.list_(pa.int32())),
        "num_bytes": [11, 17],
    }
    pq.write_table(pa.table(heldout), data_dir / "heldout.parquet")
    return data_dir


@pytest.fixture
def repeating_data(tmp_path: Path) -> Path:
    """24 sequences cycling through tokens 1..12: next token is fully predictable from the current one."""
    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    return write_mixture(tmp_path / "data", rows)


def fast_config(steps: int, **train_changes: object) -> Config:
    config = tiny()
    return dataclasses.replace(
        config, train=dataclasses.replace(config.train, steps=steps, num_threads=1, **train_changes)
    )


def test_batches_are_deterministic_disjoint_per_rank_and_resumable(repeating_data: Path) -> None:
    def stream(seed: int, rank: int = 0, world_size: int = 1, batch_size: int = 4) -> TrainBatches:
        return TrainBatches(
            repeating_data, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size
        )

    single = stream(seed=1, batch_size=8)
    ranks = [stream(seed=1, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):  # 5 x 8 sequences crosses the 24-sequence epoch boundary
        inputs, targets = single.next_batch()
        parts = [r.next_batch() for r in ranks]
        torch.testing.assert_close(torch.cat([p[0] for p in parts]), inputs)
        torch.testing.assert_close(torch.cat([p[1] for p in parts]), targets)
        torch.testing.assert_close(inputs[:, 1:], targets[:, :-1])
        assert inputs.dtype == torch.int64 and inputs.shape == (8, SEQ_LEN)

    first, second = stream(seed=1), stream(seed=1)
    first.next_batch()
    second.load_state_dict(first.state_dict())
    torch.testing.assert_close(second.next_batch()[0], first.next_batch()[0])
    assert not torch.equal(stream(seed=1).next_batch()[0], stream(seed=2).next_batch()[0])


def test_a_malformed_mixture_is_reported_with_its_file(tmp_path: Path) -> None:
    rows = np.zeros((4, SEQ_LEN + 1))
    data = write_mixture(tmp_path / "wrong_dtype", rows, dtype=np.int64)
    with pytest.raises(ValueError, match="train.npy: dtype int64"):
        TrainBatches(data, batch_size=2, seed=0)
    data = write_mixture(tmp_path / "wrong_shape", rows)
    (data / "mixture.json").write_text(
        json.dumps({"seq_len": 16, "vocab_size": 8, "eos_id": 0, "num_sequences": 4})
    )
    with pytest.raises(ValueError, match=r"train.npy: shape \(4, 33\)"):
        TrainBatches(data, batch_size=2, seed=0)
    (data / "mixture.json").write_text(json.dumps({"seq_len": 32}))
    with pytest.raises(ValueError, match=r"mixture.json: missing keys \['vocab_size'"):
        TrainBatches(data, batch_size=2, seed=0)


def test_loss_falls_on_a_repeating_dataset(repeating_data: Path, tmp_path: Path) -> None:
    summary = train(fast_config(50, checkpoint_every=50), repeating_data, tmp_path / "run")
    losses = [
        json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(losses) == 50
    assert losses[0] == pytest.approx(np.log(VOCAB), rel=0.05)
    assert summary["final_train_loss_mean_last_10"] < 0.5 * losses[0]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["optim.name=muon"],
        ["precision.recipe=bf16"],
        ["precision.recipe=fp8-emulated", "optim.name=muon"],
        [
            "precision.recipe=nvfp4-emulated",
            "model.attention_pattern=kda,mla",
            "model.router_z_loss_coef=1e-3",
        ],
    ],
)
def test_resuming_reproduces_the_uninterrupted_losses_exactly(
    repeating_data: Path, tmp_path: Path, overrides: list[str]
) -> None:
    out = tmp_path / "run"
    config = apply_overrides(fast_config(8, checkpoint_every=4, keep_checkpoints=3), overrides)
    train(config, repeating_data, out)
    uninterrupted = (out / "metrics.jsonl").read_text().splitlines()
    assert [p.name for p in list_checkpoints(out)] == ["step_4", "step_8"]

    shutil.rmtree(
        out / "checkpoints" / "step_8"
    )  # as if killed after step 8's metrics, before its checkpoint
    summary = train(config, repeating_data, out)
    resumed = (out / "metrics.jsonl").read_text().splitlines()
    assert summary["steps_this_run"] == 4 and summary["tokens_seen"] == 8 * 4 * SEQ_LEN
    assert len(resumed) == 8
    for before, after in zip(uninterrupted, resumed, strict=True):
        before, after = json.loads(before), json.loads(after)
        assert (after["step"], after["loss"], after["load_imbalance"], after["lr"], after["router"]) == (
            before["step"],
            before["loss"],
            before["load_imbalance"],
            before["lr"],
            before["router"],
        )

    again = train(config, repeating_data, out)  # a finished run: nothing to redo
    assert again["steps_this_run"] == 0 and (out / "metrics.jsonl").read_text().splitlines() == resumed


def test_resuming_with_another_model_shape_is_refused(repeating_data: Path, tmp_path: Path) -> None:
    train(fast_config(2), repeating_data, tmp_path / "run")
    wider = apply_overrides(fast_config(4), ["model.d_model=64"])
    with pytest.raises(ValueError, match=r"different model config \(model.d_model\)"):
        train(wider, repeating_data, tmp_path / "run")


def test_tracking_mode_comes_from_config_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_mode(None) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode(None) == "offline"
    assert resolve_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes'"):
        resolve_mode(None)


@pytest.mark.slow
def test_offline_tracking_writes_under_the_run_directory(repeating_data: Path, tmp_path: Path) -> None:
    config = apply_overrides(fast_config(3), ["train.wandb_mode=offline"])
    for steps in (3, 4):  # the resumed run continues the same wandb run id
        train(
            dataclasses.replace(config, train=dataclasses.replace(config.train, steps=steps)),
            repeating_data,
            tmp_path,
        )
    run_id = (tmp_path / "wandb_run_id").read_text()
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert runs and all(name.endswith(run_id) for name in runs)


def test_command_line_trains_and_writes_every_output(repeating_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "moe_dag.training", "--data", str(repeating_data), "--out", str(out)]
    command += ["--preset", "tiny", "--steps", "6", "--seed", "3", "--set", "train.checkpoint_every=3"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert "step 5/6" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["config"]["train"]["seed"] == 3
    assert summary["config"]["model"]["vocab_size"] == VOCAB  # taken from mixture.json
    assert summary["params"]["total"] == sum(summary["params"]["groups"].values())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 7))
    assert set(records[0]) == {
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "mfu",
        "load_imbalance",
        "router",
    }
    assert len(records[0]["load_imbalance"]) == 1  # tiny has one MoE layer
    assert records[0]["router"]["layers"] == [1] and 0 < records[0]["mfu"] < 1
    assert "GFLOP per token" in result.stderr and "MFU" in result.stderr
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in list_checkpoints(out)] == ["step_3", "step_6"]
    assert {p.name for p in (out / "checkpoints" / "step_6").iterdir()} == {
        "state",  # torch.distributed.checkpoint of the model and the optimizer
        "scheduler.pt",
        "state.json",
        "config.json",
        "rng_rank0.pt",
    }


@pytest.mark.slow
def test_two_rank_data_parallel_matches_one_rank(repeating_data: Path, tmp_path: Path) -> None:
    """torchrun with 2 gloo ranks of batch 2 follows the 1-rank batch-4 run (same global batches)."""
    base = [sys.executable, "-m", "moe_dag.training", "--data", str(repeating_data), "--preset", "tiny"]
    base += ["--steps", "5", "--set", "train.num_threads=1"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    one = base + ["--out", str(tmp_path / "one"), "--set", "train.batch_size=4"]
    subprocess.run(one, check=True, capture_output=True, timeout=300, env=env)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "moe_dag.training",
    ]
    two = torchrun + base[3:] + ["--out", str(tmp_path / "two"), "--set", "train.batch_size=2"]
    subprocess.run(two, check=True, capture_output=True, timeout=300, env=env)
    read = [
        [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("one", "two")
    ]
    for a, b in zip(*read, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["load_imbalance"] == pytest.approx(a["load_imbalance"], rel=1e-4)
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2
