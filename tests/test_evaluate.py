"""Held-out evaluation: windows, loss and bits per byte on hand-made examples, the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from moe_dag.training import evaluate
from moe_dag.training.checkpoint import TrainerState, save_checkpoint
from moe_dag.training.config import tiny
from moe_dag.training.evaluate import document_windows, evaluate_checkpoint, evaluate_model
from moe_dag.training.model import Transformer, build_model
from moe_dag.training.optim import build_optimizer, build_scheduler

EOS = 1
HELDOUT = {
    "source": ["web", "web", "code"],
    "id": ["w0", "w1", "c0"],
    # The code document (70 tokens) is longer than tiny's seq_len (32): three windows.
    "tokens": [[4, 5, 6, EOS], [7, 8, EOS], [*range(10, 79), EOS]],
    "num_bytes": [9, 5, 140],
}


def test_windows_predict_every_token_once_after_an_eos() -> None:
    windows = document_windows([10, 11, 12, 13, 14, EOS], eos_id=EOS, seq_len=4)
    assert windows == [([EOS, 10, 11, 12], [10, 11, 12, 13]), ([13, 14], [14, EOS])]


def save_model(model: Transformer, out: Path) -> Path:
    config = tiny()
    optimizer = build_optimizer(model, config.optim)
    return save_checkpoint(
        out,
        config=config,
        state=TrainerState(step=7, tokens_seen=0, data={}),
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, 10, config.optim),
        rank=0,
        keep=1,
    )


def write_heldout(data_dir: Path, vocab_size: int) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = {"seq_len": 32, "vocab_size": vocab_size, "eos_id": EOS, "num_sequences": 0}
    (data_dir / "mixture.json").write_text(json.dumps(meta))
    table = pa.table({**HELDOUT, "tokens": pa.array(HELDOUT["tokens"], pa.list_(pa.int32()))})
    pq.write_table(table, data_dir / "heldout.parquet")
    return data_dir


def test_uniform_logits_give_log_vocab_nats_and_known_bits_per_byte(tmp_path: Path) -> None:
    model = build_model(tiny().model)
    with torch.no_grad():
        model.output.weight.zero_()  # every logit 0: uniform over the vocabulary
    checkpoint = save_model(model, tmp_path / "run")
    vocab = model.config.vocab_size
    results = evaluate_checkpoint(checkpoint, write_heldout(tmp_path / "data", vocab), batch_size=2)

    assert results["step"] == 7
    web, code, overall = results["sources"]["web"], results["sources"]["code"], results["overall"]
    assert (web["tokens"], web["bytes"], web["documents"]) == (7, 14, 2)
    assert (code["tokens"], code["bytes"], code["documents"]) == (70, 140, 1)
    for figures in (web, code, overall):
        assert figures["loss"] == pytest.approx(math.log(vocab))
    # 7 tokens x log2(256) = 56 bits over 14 bytes; 70 x 8 bits over 140 bytes.
    assert web["bits_per_byte"] == pytest.approx(4.0)
    assert code["bits_per_byte"] == pytest.approx(4.0)
    assert overall["bits_per_byte"] == pytest.approx(77 * 8 / 154)
    # Every token costs log(vocab): no spread between documents, so no width in tokens...
    assert overall["loss_ci"] == pytest.approx([math.log(vocab)] * 2)
    # ...but bits per byte differs per document (w0: 32 bits / 9 bytes, w1: 24 / 5): the interval spans it.
    low, high = web["bits_per_byte_ci"]
    assert 32 / 9 - 1e-6 <= low <= 4.0 <= high <= 24 / 5 + 1e-6
    assert code["bits_per_byte_ci"] == pytest.approx([4.0, 4.0]) and overall["documents"] == 3


def one_window_at_a_time(model: torch.nn.Module, documents: list[list[int]]) -> list[float]:
    """Each document's summed loss in nats, its windows scored one at a time through `model(...)`'s
    whole logits: the reference the batched, pieced scoring must equal."""
    totals = []
    for tokens in documents:
        totals.append(0.0)
        for inputs, targets in document_windows(tokens, EOS, 32):
            with torch.no_grad():
                logits = model(torch.tensor([inputs]))[0]
            nll = F.cross_entropy(logits, torch.tensor(targets), reduction="none")
            totals[-1] += nll.double().sum().item()
    return totals


def test_batched_padded_windows_equal_one_document_at_a_time() -> None:
    torch.manual_seed(0)
    model = build_model(tiny().model).eval()
    # Windows are scored longest first, so a batch mixes the documents' windows out of their order;
    # each document must still get exactly its own windows' losses.
    results = evaluate_model(model, HELDOUT, seq_len=32, eos_id=EOS, batch_size=4)
    expected = one_window_at_a_time(model, HELDOUT["tokens"])
    assert results["per_document"]["nll_nats"] == pytest.approx(expected, rel=1e-5)
    assert results["overall"]["nll_nats"] == pytest.approx(sum(expected), rel=1e-5)
    assert results["overall"]["tokens"] == sum(len(t) for t in HELDOUT["tokens"])


def test_logits_made_in_pieces_give_the_same_bits_as_whole_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = build_model(tiny().model).eval()
    # Pieces of 5 positions: a 32-token window's logits are made in 7 pieces, the last of 2 positions.
    monkeypatch.setattr(evaluate, "HEAD_POSITIONS", 5)
    nll_N = evaluate.document_nll(model, HELDOUT["tokens"], seq_len=32, eos_id=EOS, batch_size=1)
    assert nll_N.tolist() == one_window_at_a_time(model, HELDOUT["tokens"])


def test_a_heldout_set_from_another_tokenizer_is_refused(tmp_path: Path) -> None:
    checkpoint = save_model(build_model(tiny().model), tmp_path / "run")
    with pytest.raises(ValueError, match="vocab_size 999 differs"):
        evaluate_checkpoint(checkpoint, write_heldout(tmp_path / "data", 999))


def test_command_line_writes_results(tmp_path: Path) -> None:
    model = build_model(tiny().model)
    checkpoint = save_model(model, tmp_path / "run")
    data = write_heldout(tmp_path / "data", model.config.vocab_size)
    out = tmp_path / "eval" / "results.json"
    command = [sys.executable, "-m", "moe_dag.training.evaluate", "--checkpoint", str(checkpoint)]
    command += ["--data", str(data), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    results = json.loads(out.read_text())
    assert set(results["sources"]) == {"web", "code"}
    assert "bits/byte (95% interval" in result.stdout and "3 documents" in result.stdout
    assert results["overall"]["bits_per_byte"] > 0
    per_document = pq.read_table(tmp_path / "eval" / "results_documents.parquet").to_pydict()
    assert per_document["id"] == HELDOUT["id"] and per_document["num_bytes"] == HELDOUT["num_bytes"]
    assert sum(per_document["nll_nats"]) == pytest.approx(results["overall"]["nll_nats"])
