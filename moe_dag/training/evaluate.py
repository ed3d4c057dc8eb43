"""Held-out evaluation: mean token loss and bits per byte, per source and overall.

Every token of a held-out document (its trailing EOS included) is predicted once. The document is
preceded by EOS, as documents are in the packed training stream, so even its first token has a
context: inputs = [EOS] + tokens[:-1], targets = tokens. A document longer than seq_len is cut into
consecutive windows of seq_len targets; each window starts with a fresh context.

    loss          = total NLL (nats) / predicted tokens
    bits per byte = total NLL (nats) / (ln 2 * total UTF-8 bytes of the documents' text)

Bits per byte does not depend on the tokenizer, so it compares models with different vocabularies.

Command line: `python -m moe_dag.training.evaluate --checkpoint DIR --data DIR --out FILE`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from moe_dag.training.checkpoint import load_model
from moe_dag.training.data import read_heldout, read_mixture

_IGNORE = -100


def document_windows(tokens: list[int], eos_id: int, seq_len: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) windows that together predict every token of the document exactly once."""
    inputs = [eos_id, *tokens[:-1]]
    return [(inputs[i : i + seq_len], tokens[i : i + seq_len]) for i in range(0, len(tokens), seq_len)]


def _totals(nll: float, tokens: int, num_bytes: int, documents: int) -> dict[str, Any]:
    return {
        "loss": nll / tokens if tokens else None,
        "bits_per_byte": nll / (math.log(2) * num_bytes) if num_bytes else None,
        "nll_nats": nll,
        "tokens": tokens,
        "bytes": num_bytes,
        "documents": documents,
    }


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    heldout: dict[str, list[Any]],
    *,
    seq_len: int,
    eos_id: int,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Per-source and overall loss and bits per byte of `model` on held-out documents (columns as
    returned by `data.read_heldout`: source, tokens, num_bytes)."""
    model.eval()
    windows = [
        (source, window)
        for source, tokens in zip(heldout["source"], heldout["tokens"], strict=True)
        if tokens
        for window in document_windows(tokens, eos_id, seq_len)
    ]
    nll: dict[str, float] = defaultdict(float)
    predicted: dict[str, int] = defaultdict(int)
    for start in tqdm(range(0, len(windows), batch_size), desc="evaluate", disable=None):
        chunk = windows[start : start + batch_size]
        width = max(len(targets) for _, (_, targets) in chunk)
        inputs_BS = torch.zeros(len(chunk), width, dtype=torch.long)
        targets_BS = torch.full((len(chunk), width), _IGNORE, dtype=torch.long)
        for row, (_, (inputs, targets)) in enumerate(chunk):
            inputs_BS[row, : len(inputs)] = torch.tensor(inputs)
            targets_BS[row, : len(targets)] = torch.tensor(targets)
        # Right padding is safe: causal attention keeps padded positions from reaching real ones.
        logits_BSV = model(inputs_BS.to(device))
        nll_BS = F.cross_entropy(
            logits_BSV.flatten(0, 1), targets_BS.to(device).flatten(), ignore_index=_IGNORE, reduction="none"
        ).view(len(chunk), width)
        for row, nll_row in enumerate(nll_BS.double().sum(dim=1).tolist()):
            source, (_, targets) = chunk[row]
            nll[source] += nll_row
            predicted[source] += len(targets)
    num_bytes: dict[str, int] = defaultdict(int)
    documents: dict[str, int] = defaultdict(int)
    for source, size in zip(heldout["source"], heldout["num_bytes"], strict=True):
        num_bytes[source] += size
        documents[source] += 1
    sources = {
        source: _totals(nll[source], predicted[source], num_bytes[source], documents[source])
        for source in sorted(documents)
    }
    overall = _totals(
        sum(nll.values()), sum(predicted.values()), sum(num_bytes.values()), sum(documents.values())
    )
    return {"overall": overall, "sources": sources}


def evaluate_checkpoint(
    checkpoint_dir: Path,
    data_dir: Path,
    *,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Evaluate a trained checkpoint (`<out>/checkpoints/step_<N>`) on `<data_dir>/heldout.parquet`."""
    model, config = load_model(checkpoint_dir, device)
    mixture = read_mixture(data_dir)
    if mixture.vocab_size != config.model.vocab_size:
        raise ValueError(
            f"{data_dir}/mixture.json: vocab_size {mixture.vocab_size} differs from the checkpoint's "
            f"{config.model.vocab_size}; the held-out set was tokenized with another tokenizer"
        )
    results = evaluate_model(
        model,
        read_heldout(data_dir),
        seq_len=config.model.seq_len,
        eos_id=mixture.eos_id,
        batch_size=batch_size,
        device=device,
    )
    state = json.loads((Path(checkpoint_dir) / "state.json").read_text())
    return {"checkpoint": str(checkpoint_dir), "step": state["step"], "data_dir": str(data_dir), **results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_dag.training.evaluate", description=__doc__)
    parser.add_argument(
        "--checkpoint", type=Path, required=True, help="a <out>/checkpoints/step_<N> directory"
    )
    parser.add_argument("--data", type=Path, required=True, help="tokenized mixture directory")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    results = evaluate_checkpoint(args.checkpoint, args.data, batch_size=args.batch_size, device=args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    overall = results["overall"]
    print(f"held-out loss {overall['loss']:.4f} nats/token, {overall['bits_per_byte']:.4f} bits/byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
