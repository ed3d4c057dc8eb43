"""Held-out evaluation: mean token loss and bits per byte, per source and overall.

Every token of a held-out document (its trailing EOS included) is predicted once. The document is
preceded by EOS, as documents are in the packed training stream, so even its first token has a
context: inputs = [EOS] + tokens[:-1], targets = tokens. A document longer than seq_len is cut into
consecutive windows of seq_len targets; each window starts with a fresh context.

    loss          = total NLL (nats) / predicted tokens
    bits per byte = total NLL (nats) / (ln 2 * total UTF-8 bytes of the documents' text)

Bits per byte does not depend on the tokenizer, so it compares models with different vocabularies.
Each figure comes with its document count and a 95% interval from resampling documents (bootstrap.py),
so a source scored on a handful of documents shows how little that says.

`evaluate_run` scores a run's newest checkpoint and leaves in the run folder `eval.json` (the figures)
and `eval_documents.parquet` (source, id, nll_nats, tokens, num_bytes per document: what a paired
comparison of two models on the same documents needs).

Command line: `python -m moe_dag.training.evaluate --checkpoint DIR --data DIR --out FILE [--device D]`.

Shape legend: B windows of a batch, S positions of a window, P a batch's positions (B x S), D model
width, V vocabulary, W windows, N documents.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from tqdm import tqdm

from moe_dag.training.bootstrap import ratio_interval
from moe_dag.training.checkpoint import latest_checkpoint, load_model
from moe_dag.training.data import read_heldout, read_mixture
from moe_dag.training.model import Transformer

_IGNORE = -100
# Windows run through the blocks in one forward pass. More do not pay on CPU: on the 0.8M-parameter
# mixture-search proxy (seq_len 128, one thread) 16, 32 and 64 windows took within 5% of 8's time,
# and moved documents' losses in float32's last bits.
BATCH_SIZE = 8
# Positions whose logits are made and scored at once, so that a batch's [8 x 128, 4,096] float32 logits
# and their log-softmax are not two fresh 16 MiB buffers: glibc maps buffers that large from the OS and
# faults their pages in again on many batches. On that proxy (one thread, AVX-512 Xeon) the head and the
# loss took 6.6-6.9 ms per 1,024 positions in pieces of 64 to 512, 16 ms whole; the head's product
# alone takes 5.5. Scoring the swarm's 210 neutral documents (221k tokens) took 4.1 s whole and 3.1 s in
# pieces (medians of 5, alternating, under load), with 429k and 643 page faults. On CPU a position's
# logits and loss are the same bits in any piece (tests/test_evaluate.py); a GPU's products may round
# them differently, as another batch size does.
HEAD_POSITIONS = 256


def document_windows(tokens: list[int], eos_id: int, seq_len: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) windows that together predict every token of the document exactly once."""
    inputs = [eos_id, *tokens[:-1]]
    return [(inputs[i : i + seq_len], tokens[i : i + seq_len]) for i in range(0, len(tokens), seq_len)]


@torch.inference_mode()
def document_nll(
    model: Transformer,
    tokens: list[list[int]],
    *,
    seq_len: int,
    eos_id: int,
    batch_size: int = BATCH_SIZE,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """The summed NLL (nats, float64) of every token of each document, in order; 0 for an empty one."""
    model.eval()
    windows = [
        (document, window)
        for document, document_tokens in enumerate(tokens)
        if document_tokens
        for window in document_windows(document_tokens, eos_id, seq_len)
    ]
    # Longest first, so that a batch's windows are of about one length: of the positions scored on the
    # demo's neutral set, 5.7% were padding in document order, 0.02% sorted (8 windows a batch). A
    # window's loss does not depend on which windows share its batch, to rounding in float32's last bits.
    order = sorted(range(len(windows)), key=lambda w: -len(windows[w][1][1]))
    nll_W = np.zeros(len(windows))
    for start in tqdm(range(0, len(order), batch_size), desc="evaluate", disable=None):
        chunk = order[start : start + batch_size]
        width = len(windows[chunk[0]][1][1])
        inputs_BS = torch.zeros(len(chunk), width, dtype=torch.long)
        targets_BS = torch.full((len(chunk), width), _IGNORE, dtype=torch.long)
        for row, w in enumerate(chunk):
            inputs, targets = windows[w][1]
            inputs_BS[row, : len(inputs)] = torch.tensor(inputs)
            targets_BS[row, : len(targets)] = torch.tensor(targets)
        # Right padding is safe: causal attention keeps padded positions from reaching real ones.
        head_input_PD = model.head_input(inputs_BS.to(device)).flatten(0, 1)
        targets_P = targets_BS.to(device).flatten()
        nll_P = torch.empty(len(targets_P), device=device)
        for first in range(0, len(targets_P), HEAD_POSITIONS):
            piece = slice(first, first + HEAD_POSITIONS)
            logits_PV = model.output(head_input_PD[piece]).float()  # as `model(inputs)` makes them
            nll_P[piece] = F.cross_entropy(
                logits_PV, targets_P[piece], ignore_index=_IGNORE, reduction="none"
            )
        nll_W[chunk] = nll_P.view(len(chunk), width).double().sum(dim=1).cpu().numpy()
    # Summed in window order, as they were when scored in document order: the same float64 totals.
    nll_N = np.zeros(len(tokens))
    np.add.at(nll_N, np.array([document for document, _ in windows], dtype=np.int64), nll_W)
    return nll_N


def summarize(
    sources: list[str], nll_N: np.ndarray, tokens_N: np.ndarray, bytes_N: np.ndarray, *, seed: int = 0
) -> dict[str, Any]:
    """Per-source and overall figures, each with its document count and 95% bootstrap intervals."""
    sources_N = np.asarray(sources)
    per_source = {
        source: _figures(nll_N[mask], tokens_N[mask], bytes_N[mask], None, seed)
        for source in sorted(set(sources))
        if (mask := sources_N == source).any()
    }
    return {"overall": _figures(nll_N, tokens_N, bytes_N, sources_N, seed), "sources": per_source}


def _figures(
    nll_N: np.ndarray, tokens_N: np.ndarray, bytes_N: np.ndarray, strata_N: np.ndarray | None, seed: int
) -> dict[str, Any]:
    nll, tokens, num_bytes = float(nll_N.sum()), int(tokens_N.sum()), int(bytes_N.sum())
    bits_N = nll_N / math.log(2)
    return {
        "loss": nll / tokens if tokens else None,
        "loss_ci": list(ratio_interval(nll_N, tokens_N, strata_N, seed=seed)) if tokens else None,
        "bits_per_byte": nll / (math.log(2) * num_bytes) if num_bytes else None,
        "bits_per_byte_ci": list(ratio_interval(bits_N, bytes_N, strata_N, seed=seed)) if num_bytes else None,
        "nll_nats": nll,
        "tokens": tokens,
        "bytes": num_bytes,
        "documents": len(nll_N),
    }


def evaluate_model(
    model: Transformer,
    heldout: dict[str, list[Any]],
    *,
    seq_len: int,
    eos_id: int,
    batch_size: int = BATCH_SIZE,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Per-source and overall loss and bits per byte of `model` on held-out documents (columns as
    returned by `data.read_heldout`: source, tokens, num_bytes), with intervals and document counts;
    under "per_document" the columns source, id, nll_nats, tokens, num_bytes."""
    nll_N = document_nll(
        model, heldout["tokens"], seq_len=seq_len, eos_id=eos_id, batch_size=batch_size, device=device
    )
    tokens_N = np.array([len(tokens) for tokens in heldout["tokens"]], dtype=np.int64)
    bytes_N = np.array(heldout["num_bytes"], dtype=np.int64)
    per_document = {
        "source": list(heldout["source"]),
        "id": list(heldout["id"]),
        "nll_nats": nll_N.tolist(),
        "tokens": tokens_N.tolist(),
        "num_bytes": bytes_N.tolist(),
    }
    return {**summarize(heldout["source"], nll_N, tokens_N, bytes_N), "per_document": per_document}


def evaluate_checkpoint(
    checkpoint_dir: Path,
    data_dir: Path,
    *,
    batch_size: int = BATCH_SIZE,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Evaluate a trained checkpoint (`<out>/checkpoints/step_<N>`) on `<data_dir>/heldout.parquet`."""
    heldout = read_heldout(data_dir)
    if not heldout["source"]:
        raise ValueError(
            f"{data_dir}/heldout.parquet holds no documents to evaluate on (mixture.heldout_min_documents 0?)"
        )
    model, config = load_model(checkpoint_dir, device)
    mixture = read_mixture(data_dir)
    if mixture.vocab_size != config.model.vocab_size:
        raise ValueError(
            f"{data_dir}/mixture.json: vocab_size {mixture.vocab_size} differs from the checkpoint's "
            f"{config.model.vocab_size}; the held-out set was tokenized with another tokenizer"
        )
    results = evaluate_model(
        model,
        heldout,
        seq_len=config.model.seq_len,
        eos_id=mixture.eos_id,
        batch_size=batch_size,
        device=device,
    )
    state = json.loads((Path(checkpoint_dir) / "state.json").read_text())
    return {"checkpoint": str(checkpoint_dir), "step": state["step"], "data_dir": str(data_dir), **results}


EVAL_FILE = "eval.json"
EVAL_DOCUMENTS_FILE = "eval_documents.parquet"


def evaluate_run(
    run_dir: Path, data_dir: Path, *, device: torch.device | str = "cpu", batch_size: int = BATCH_SIZE
) -> dict[str, Any]:
    """Score the newest checkpoint of `run_dir` on `data_dir`'s held-out documents and write
    `eval.json` and `eval_documents.parquet` beside it; returns the figures."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ValueError(f"{run_dir}: no finished checkpoint to evaluate")
    results = evaluate_checkpoint(checkpoint, data_dir, batch_size=batch_size, device=device)
    return write_evaluation(results, Path(run_dir) / EVAL_FILE, Path(run_dir) / EVAL_DOCUMENTS_FILE)


def write_evaluation(results: dict[str, Any], json_path: Path, documents_path: Path) -> dict[str, Any]:
    """Write the figures as JSON and the per-document losses as parquet; returns the figures."""
    figures = {key: value for key, value in results.items() if key != "per_document"}
    for path, write in (
        (documents_path, lambda tmp: pq.write_table(pa.table(results["per_document"]), tmp)),
        (json_path, lambda tmp: tmp.write_text(json.dumps(figures, indent=2) + "\n")),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        write(partial)
        partial.replace(path)
    return figures


def resolve_device(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_dag.training.evaluate", description=__doc__)
    parser.add_argument(
        "--checkpoint", type=Path, required=True, help="a <out>/checkpoints/step_<N> directory"
    )
    parser.add_argument("--data", type=Path, required=True, help="tokenized mixture directory")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (cuda when present)")
    args = parser.parse_args(argv)
    results = evaluate_checkpoint(
        args.checkpoint, args.data, batch_size=args.batch_size, device=resolve_device(args.device)
    )
    figures = write_evaluation(results, args.out, args.out.with_name(args.out.stem + "_documents.parquet"))
    overall = figures["overall"]
    low, high = overall["bits_per_byte_ci"]
    print(
        f"held-out loss {overall['loss']:.4f} nats/token, {overall['bits_per_byte']:.4f} bits/byte "
        f"(95% interval {low:.4f}-{high:.4f}, {overall['documents']} documents)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
