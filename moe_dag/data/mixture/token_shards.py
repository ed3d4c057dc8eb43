"""Token shards: one source's documents as one flat, memory-mappable token file plus a document index.

Layout for a source `cc` under a folder:

    cc.bin            raw token ids, little-endian uint16 (vocab <= 65536) or uint32, every
                      document followed by the end-of-document token
    cc.index.parquet  one row per document: id, offset and length (in tokens, EOS included), num_bytes
                      (UTF-8 bytes of the text, the denominator of bits per byte); the token dtype, the
                      vocabulary size and the EOS id ride in the parquet schema metadata

A raw file rather than `.npy` because documents are encoded and appended in batches: the total length is
unknown until the last batch, and an `.npy` header must state it up front.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer
from tqdm import tqdm

INDEX_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("num_bytes", pa.int64(), nullable=False),
    ]
)
METADATA_KEY = b"moe_dag.token_shard"
ENCODE_BATCH_DOCUMENTS = 1024


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every id: ids run 0..vocab_size-1."""
    # Little-endian on every machine, so a shard written on one host reads the same on any other.
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def encode_documents(tokenizer: Tokenizer, texts: list[str], eos: int, dtype: np.dtype) -> list[np.ndarray]:
    """Each text's token ids with `eos` appended. `encode_batch` spreads the batch over all cores."""
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return [np.array([*encoding.ids, eos], dtype=dtype) for encoding in encodings]


def write_token_shard(
    table: pa.Table, tokenizer: Tokenizer, eos: int, folder: Path, source: str
) -> TokenShard:
    """Tokenise `table` (columns `id`, `text`, in order) into `folder/<source>.bin` + `.index.parquet`.

    Both files are written under temporary names and renamed, so a killed run never leaves a shard that
    looks finished. Returns the shard opened for reading."""
    for column in ("id", "text"):
        if column not in table.column_names:
            raise ValueError(f"documents of source {source!r} have no {column!r} column")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    tokens_path, index_path = shard_paths(folder, source)
    partial_tokens = tokens_path.with_name(f".{tokens_path.name}.partial")
    lengths: list[int] = []
    num_bytes: list[int] = []
    with partial_tokens.open("wb") as out:
        starts = range(0, table.num_rows, ENCODE_BATCH_DOCUMENTS)
        for start in tqdm(starts, desc=f"tokenize {source}", unit="batch", disable=None):
            texts = table["text"].slice(start, ENCODE_BATCH_DOCUMENTS).to_pylist()
            for document in encode_documents(tokenizer, texts, eos, dtype):
                out.write(document.tobytes())
                lengths.append(len(document))
            num_bytes.extend(len(text.encode("utf-8")) for text in texts)
    length_array = np.array(lengths, dtype=np.int64)
    offsets = np.cumsum(length_array) - length_array
    metadata = {"dtype": dtype.name, "vocab_size": vocab_size, "eos_id": eos}
    index = pa.table(
        {
            "id": table["id"].cast(pa.string()),
            "offset": offsets,
            "length": length_array,
            "num_bytes": num_bytes,
        },
        schema=INDEX_SCHEMA.with_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True)}),
    )
    partial_index = index_path.with_name(f".{index_path.name}.partial")
    pq.write_table(index, partial_index)
    partial_tokens.replace(tokens_path)
    partial_index.replace(index_path)
    return TokenShard.open(folder, source)


def shard_paths(folder: Path, source: str) -> tuple[Path, Path]:
    """(token file, index file) of `source` under `folder`."""
    return Path(folder) / f"{source}.bin", Path(folder) / f"{source}.index.parquet"


@dataclass(kw_only=True)
class TokenShard:
    """One source's tokens, memory-mapped, with its document index as numpy arrays."""

    source: str
    tokens: np.ndarray
    ids: pa.ChunkedArray
    offsets: np.ndarray
    lengths: np.ndarray
    num_bytes: np.ndarray
    vocab_size: int
    eos_id: int

    @classmethod
    def open(cls, folder: Path, source: str) -> TokenShard:
        tokens_path, index_path = shard_paths(folder, source)
        if not index_path.is_file() or not tokens_path.is_file():
            raise ValueError(f"no token shard for source {source!r} under {folder}")
        index = pq.read_table(index_path)
        metadata = json.loads(index.schema.metadata[METADATA_KEY])
        dtype = np.dtype(metadata["dtype"]).newbyteorder("<")
        # np.memmap refuses an empty file, and a source may legitimately keep no documents.
        if tokens_path.stat().st_size == 0:
            tokens = np.empty(0, dtype=dtype)
        else:
            tokens = np.memmap(tokens_path, dtype=dtype, mode="r")
        lengths = index["length"].to_numpy()
        if int(lengths.sum()) != len(tokens):
            raise ValueError(f"{tokens_path} holds {len(tokens)} tokens, its index says {int(lengths.sum())}")
        return cls(
            source=source,
            tokens=tokens,
            ids=index["id"],
            offsets=index["offset"].to_numpy(),
            lengths=lengths,
            num_bytes=index["num_bytes"].to_numpy(),
            vocab_size=metadata["vocab_size"],
            eos_id=metadata["eos_id"],
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def document(self, index: int) -> np.ndarray:
        """The tokens of document `index`, EOS included (a view into the memory map)."""
        start = int(self.offsets[index])
        return self.tokens[start : start + int(self.lengths[index])]
