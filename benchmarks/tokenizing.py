"""Tokenising: `write_token_shard` against Hugging Face tokenizers' `encode_batch` on one thread, for the
same token stream (goal: ratio >= 1.0, the library's speed or better).

Input: real text installed with Python (the standard library's modules, cut into documents of about
`--chars` characters), and a byte-level BPE of the demo's size (4,096) trained on it, as the
`tokenizer` asset trains one, saved and read back by each side as it would be: the baseline with the
library's `Tokenizer.from_file`, `write_token_shard` with `load_tokenizer`, as a tokenising worker
loads it (the model's word cache enlarged: `remember_more_words`; ids unchanged). Both sides run on
one thread (`RAYON_RS_NUM_CPUS=1`, set before tokenizers loads), alternating, `--repeats` times each;
the best CPU time (`time.process_time`, every thread of the process) of each counts, so other work on
a shared machine does not move the ratio much.

- `encode_batch`: `Tokenizer.encode_batch` over the documents in batches of `ENCODE_BATCH_DOCUMENTS`,
  the ids kept as the library returns them; nothing else.
- `write_token_shard`: the whole shard written as `tokenized_mixture` writes one: token file (every
  document followed by EOS) and its document index (ids, offsets, lengths, UTF-8 bytes).

The token streams are checked equal before any figure is printed. Last line JSON: `bench`,
`documents`, `tokens`, `encode_batch_tokens_per_s`, `write_token_shard_tokens_per_s`, `ratio`
(write_token_shard / encode_batch throughput).
"""

from __future__ import annotations

import os

# One thread for both sides: tokenizers sizes its thread pool from this when it first encodes a batch.
os.environ["RAYON_RS_NUM_CPUS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from benchmarks._smoke import parse_with_smoke
from moe_dag.mixture.token_shards import ENCODE_BATCH_DOCUMENTS, write_token_shard  # noqa: E402
from moe_dag.mixture.tokenizer import (  # noqa: E402
    TokenizerConfig,
    eos_id,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)


def stdlib_documents(count: int, chars: int) -> list[str]:
    """Up to `count` documents of about `chars` characters, cut at line ends from the stdlib's modules."""
    documents: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        piece: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            piece.append(line)
            size += len(line)
            if size >= chars:
                documents.append("".join(piece))
                piece, size = [], 0
                if len(documents) == count:
                    return documents
        if piece:
            documents.append("".join(piece))
            if len(documents) == count:
                return documents
    return documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--chars", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_smoke(parser, {"documents": 200, "chars": 500, "repeats": 1})

    texts = stdlib_documents(args.documents, args.chars)
    trained = train_tokenizer(texts, TokenizerConfig(vocab_size=4096))
    eos = eos_id(trained)
    table = pa.table({"id": [f"doc-{i}" for i in range(len(texts))], "text": texts})
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} M characters")

    def encode_batch() -> list[list[int]]:
        ids: list[list[int]] = []
        for start in range(0, len(texts), ENCODE_BATCH_DOCUMENTS):
            batch = texts[start : start + ENCODE_BATCH_DOCUMENTS]
            ids.extend(encoding.ids for encoding in library.encode_batch(batch, add_special_tokens=False))
        return ids

    timings: dict[str, list[float]] = {"encode_batch": [], "write_token_shard": []}
    with tempfile.TemporaryDirectory() as folder:
        saved = save_tokenizer(trained, Path(folder) / "tokenizer")
        library, ours = Tokenizer.from_file(str(saved)), load_tokenizer(saved)
        for _ in range(args.repeats):
            started = time.process_time()
            baseline = encode_batch()
            timings["encode_batch"].append(time.process_time() - started)
            started = time.process_time()
            shard = write_token_shard(table, ours, eos, Path(folder), "bench")
            timings["write_token_shard"].append(time.process_time() - started)
        stream = np.fromiter((t for ids in baseline for t in (*ids, eos)), dtype=np.int64)
        if not np.array_equal(np.asarray(shard.tokens, dtype=np.int64), stream):
            raise SystemExit("write_token_shard wrote another token stream than encode_batch gives")
        tokens = len(stream)
    best = {name: min(seconds) for name, seconds in timings.items()}
    rates = {name: tokens / seconds for name, seconds in best.items()}
    for name, rate in rates.items():
        print(f"{name:>18}: {best[name]:.3f} s CPU best of {args.repeats}, {rate / 1e6:.2f} M tokens/s")
    ratio = rates["write_token_shard"] / rates["encode_batch"]
    print(f"write_token_shard / encode_batch: {ratio:.2f}x")
    result = {
        "bench": "tokenizing",
        "documents": len(texts),
        "tokens": tokens,
        "encode_batch_tokens_per_s": round(rates["encode_batch"]),
        "write_token_shard_tokens_per_s": round(rates["write_token_shard"]),
        "ratio": round(ratio, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
