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


def test_batches_read_one_row_per_lane_disjoint_per_rank_and_resumable(repeating_data: Path) -> None:
    def stream(rank: int = 0, world_size: int = 1, batch_size: int = 4) -> TrainBatches:
        return TrainBatches(repeating_data, batch_size=batch_size, rank=rank, world_size=world_size)

    rows = torch.from_numpy(np.load(repeating_data / "train.npy").astype(np.int64))
    single = stream(batch_size=8)
    ranks = [stream(rank=r, world_size=2) for r in range(2)]
    served = []
    for step in range(5):  # 8 lanes of 3 rows each: steps 3 and 4 start the second pass
        inputs, targets = single.next_batch()
        expected = [(lane * 3 + step) % 24 for lane in range(8)]
        served += expected
        torch.testing.assert_close(inputs, rows[expected, :-1])
        torch.testing.assert_close(targets, rows[expected, 1:])
        parts = [r.next_batch() for r in ranks]
        torch.testing.assert_close(torch.cat([p[0] for p in parts]), inputs)
        torch.testing.assert_close(torch.cat([p[1] for p in parts]), targets)
    assert sorted(served[:24]) == list(range(24))  # a pass reads every row once

    first, second = stream(), stream()
    first.next_batch()
    second.load_state_dict(first.state_dict())
    torch.testing.assert_close(second.next_batch()[0], first.next_batch()[0])
    with pytest.raises(ValueError, match="mixture of 25 sequences, this one has 24"):
        second.load_state_dict({**first.state_dict(), "num_sequences": 25})
    with pytest.raises(ValueError, match="read 8 rows per step"):
        second.load_state_dict({**first.state_dict(), "lanes": 8})
    with pytest.raises(ValueError, match="in order None, this trainer in 'lanes-v1'"):
        second.load_state_dict({"consumed": 4, "num_sequences": 24})  # an older trainer's state


def test_a_malformed_mixture_is_reported_with_its_file(tmp_path: Path) -> None:
    rows = np.zeros((4, SEQ_LEN + 1))
    data = write_mixture(tmp_path / "wrong_dtype", rows, dtype=np.int64)
    with pytest.raises(ValueError, match="train.npy: dtype int64"):
        TrainBatches(data, batch_size=2)
    data = write_mixture(tmp_path / "wrong_shape", rows)
    (data / "mixture.json").write_text(
        json.dumps({"seq_len": 16, "vocab_size": 8, "eos_id": 0, "num_sequences": 4})
    )
    with pytest.raises(ValueError, match=r"train.npy: shape \(4, 33\)"):
        TrainBatches(data, batch_size=2)
    (data / "mixture.json").write_text(json.dumps({"seq_len": 32}))
    with pytest.raises(ValueError, match=r"mixture.json: missing keys \['vocab_size'"):
        TrainBatches(data, batch_size=2)


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
    assert (out / "metrics.jsonl").read_text().splitlines() == resumed
    # Its summary keeps the timings of the run that trained, not those of a resume with nothing to do.
    assert again == json.loads((out / "summary.json").read_text())
    timings = ("steps_this_run", "wall_seconds", "steps_per_second")
    assert [again[key] for key in timings] == [summary[key] for key in timings] and again["wall_seconds"] > 0


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
        "source_shares",
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
        "metrics.jsonl",  # the metrics up to this step, restored on resume
        "manifest.json",  # sha256 of every file above, verified before anything is loaded
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


@pytest.fixture(scope="module")
def built_mixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real mixture from the data room: three sources of short documents, so the longest document
    (the unit of the share guarantee) is small next to the tokens of a few steps."""
    from moe_dag.mixture import MixtureConfig, build_mixture
    from moe_dag.mixture.tokenizer import TokenizerConfig, train_tokenizer

    rng = np.random.default_rng(0)
    words = ["data", "model", "expert", "token", "the", "of", "and", "route"]
    documents = {
        source: pa.table(
            {
                "id": [f"{source}-{i}" for i in range(n)],
                "text": [" ".join(rng.choice(words, size=rng.integers(3, 12))) for _ in range(n)],
            }
        )
        for source, n in (("web", 600), ("code", 400), ("math", 200))
    }
    texts = [text for table in documents.values() for text in table["text"].to_pylist()]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=300))
    config = MixtureConfig(
        weights={"web": 0.5, "code": 0.3, "math": 0.2}, seq_len=SEQ_LEN, heldout_min_documents=5
    )
    out = tmp_path_factory.mktemp("mixture")
    build_mixture(documents, tokenizer, config, out)
    return out


def _longest_document(mixture_dir: Path) -> int:
    from moe_dag.mixture import TokenShard

    sources = json.loads((mixture_dir / "mixture.json").read_text())["sources"]
    return max(int(TokenShard.open(mixture_dir / "shards", source).lengths.max()) for source in sources)


def test_every_step_of_a_pass_keeps_the_shares_within_two_documents_per_lane(built_mixture: Path) -> None:
    """After k steps the model has seen one window of k consecutive rows per lane; each window is
    within 4 L tokens of the target shares (L the longest document), so all of them within 4 G L.
    Rows drawn at random from the file wander past this bound within a pass."""
    batches = TrainBatches(built_mixture, batch_size=2)
    targets = {
        s: row["target_share"]
        for s, row in json.loads((built_mixture / "mixture.json").read_text())["sources"].items()
    }
    bound = 4 * batches.lanes * _longest_document(built_mixture)
    for step in range(1, batches.info.num_sequences // batches.lanes + 1):
        batches.next_batch()
        trained = step * batches.lanes * (SEQ_LEN + 1)
        for source, share in batches.source_shares().items():
            assert abs(share - targets[source]) * trained <= bound, (step, source)


def test_every_step_trains_on_the_target_shares_and_resuming_keeps_the_order(
    built_mixture: Path, tmp_path: Path
) -> None:
    """The shares the trainer logs after every step are those of the rows it read (within the lane
    bound); resuming from a checkpoint continues the same rows, shares included."""
    mixture = json.loads((built_mixture / "mixture.json").read_text())
    out = tmp_path / "run"
    config = fast_config(30, checkpoint_every=10)
    train(config, built_mixture, out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    bound = 4 * config.train.batch_size * _longest_document(built_mixture)
    for record in records:
        trained = record["step"] * config.train.batch_size * (SEQ_LEN + 1)
        assert sum(record["source_shares"].values()) == pytest.approx(1.0)
        for source, share in record["source_shares"].items():
            target = mixture["sources"][source]["target_share"]
            assert abs(share - target) * trained <= bound, (record["step"], source)
    assert (out / "source_shares.png").exists() and (out / "expert_load.png").exists()

    shutil.rmtree(out / "checkpoints" / "step_30")
    shutil.rmtree(out / "checkpoints" / "step_20")
    train(config, built_mixture, out)
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["loss"], r["source_shares"]) for r in resumed] == [
        (r["loss"], r["source_shares"]) for r in records
    ]


def test_the_training_room_imports_neither_dagster_nor_its_pipes_outside_dagster() -> None:
    """`python -m moe_dag.training` runs where Dagster is not installed; dagster_pipes is loaded only
    when a Pipes client launched the process."""
    modules = [
        "moe_dag.training.__main__",
        "moe_dag.training.trainer",
        "moe_dag.training.evaluate",
        "moe_dag.training.compare",
        "moe_dag.training.baselines",
    ]
    code = f"import sys\nfor m in {modules}: __import__(m)\n"
    code += "print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'dagster_pipes'}))"
    env = {key: value for key, value in os.environ.items() if not key.startswith("DAGSTER_PIPES")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "[]"
