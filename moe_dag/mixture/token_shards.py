"""Token shards: documents as flat, memory-mappable token files plus a document index.

A source is one shard (`build_mixture` on in-memory tables) or one shard per input shard (the engine
tokenising a source's lake shards in parallel, each named by its shard key); `SourceTokens` puts a
source's shards end to end. Layout for a shard `cc` under a folder:

    cc.bin            raw token ids, little-endian uint16 (vocab <= 65536) or uint32, every
                      document followed by the end-of-document token
    cc.index.parquet  one row per document: id, offset and length (in tokens, EOS included), num_bytes
                      (UTF-8 bytes of the text, the denominator of bits per byte); the token dtype, the
                      vocabulary size and the EOS id ride in the parquet schema metadata

A raw file rather than `.npy` because documents are encoded and appended in batches: the total length is
unknown until the last batch, and an `.npy` header must state it up front.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer
from tqdm import tqdm

from moe_dag.engine.tasks import map_tasks
from moe_dag.storage.atomic import atomic_path
from moe_dag.storage.lake import Lake

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


def encode_stream(
    tokenizer: Tokenizer, texts: list[str], eos: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The texts' token ids end to end, each followed by `eos`, and each document's length (EOS included).

    One `encode_batch_fast` call (it spreads the batch over all cores) and one array per batch, filled by
    numpy, not one per document: the library's encoding is the floor, so the work around it must stay a
    small fraction of it (benchmarks/tokenizing.py). `encode_batch_fast` gives the same ids as
    `encode_batch` without computing each token's character offsets, which nothing here reads.
    """
    ids = [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    for document in ids:
        document.append(eos)  # in place: one pass of numpy over the ids, no mask and no second array
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    stream = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return stream, lengths


def write_token_shard(
    table: pa.Table, tokenizer: Tokenizer, eos: int, folder: Path, source: str
) -> TokenShard:
    """Tokenise `table` (columns `id`, `text`, in order) into `folder/<source>.bin` + `.index.parquet`.

    Both files are written under temporary names and renamed, so a killed run never leaves a shard that
    looks finished. Returns the shard opened for reading."""
    for column in ("id", "text"):
        if column not in table.column_names:
            raise ValueError(f"documents of source {source!r} have no {column!r} column")
    tokens_path, index_path = shard_paths(Path(folder), source)
    with (
        atomic_path(tokens_path) as partial_tokens,
        atomic_path(index_path) as partial_index,
        TokenShardWriter(tokenizer, eos, partial_tokens, partial_index) as writer,
    ):
        starts = range(0, table.num_rows, ENCODE_BATCH_DOCUMENTS)
        for start in tqdm(starts, desc=f"tokenize {source}", unit="batch", disable=None):
            writer.write(table.slice(start, ENCODE_BATCH_DOCUMENTS))
    return TokenShard.open(folder, source)


class TokenShardWriter:
    """Appends batches of documents (`id`, `text`) to a token file; writes the index on close.

    Only one batch of documents is in memory at a time, so a shard of any size streams through."""

    def __init__(self, tokenizer: Tokenizer, eos: int, tokens_path: Path, index_path: Path) -> None:
        self.tokenizer, self.eos = tokenizer, eos
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.dtype = token_dtype(self.vocab_size)
        self.tokens_path, self.index_path = Path(tokens_path), Path(index_path)
        self.ids: list[pa.Array] = []
        self.lengths: list[np.ndarray] = []
        self.num_bytes: list[np.ndarray] = []
        self._out = None

    @property
    def tokens(self) -> int:
        return int(sum(int(lengths.sum()) for lengths in self.lengths))

    def __enter__(self) -> TokenShardWriter:
        self.tokens_path.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.tokens_path.open("wb")
        return self

    def write(self, table: pa.Table) -> None:
        for start in range(0, table.num_rows, ENCODE_BATCH_DOCUMENTS):
            part = table.slice(start, ENCODE_BATCH_DOCUMENTS)
            if not part.num_rows:
                continue
            stream, lengths = encode_stream(self.tokenizer, part["text"].to_pylist(), self.eos, self.dtype)
            self._out.write(stream.tobytes())
            self.lengths.append(lengths)
            self.num_bytes.append(pc.binary_length(part["text"]).to_numpy().astype(np.int64))
            self.ids.append(part["id"].cast(pa.string()).combine_chunks())

    def __exit__(self, *failure: object) -> None:
        self._out.close()
        if failure[0] is not None:
            return
        length_array = np.concatenate([np.empty(0, dtype=np.int64), *self.lengths])
        metadata = {"dtype": self.dtype.name, "vocab_size": self.vocab_size, "eos_id": self.eos}
        index = pa.table(
            {
                "id": pa.concat_arrays([pa.array([], pa.string()), *self.ids]),
                "offset": np.cumsum(length_array) - length_array,
                "length": length_array,
                "num_bytes": np.concatenate([np.empty(0, dtype=np.int64), *self.num_bytes]),
            },
            schema=INDEX_SCHEMA.with_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True)}),
        )
        pq.write_table(index, self.index_path)


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
        """The shard `<source>.bin` under `folder` (a source's one shard, or one input shard's key)."""
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


class SourceTokens:
    """A source's token shards end to end: document i of the source is document j of one shard."""

    def __init__(self, source: str, shards: list[TokenShard]) -> None:
        if not shards:
            raise ValueError(f"source {source!r} has no token shard")
        self.source = source
        self.shards = shards
        self.lengths = np.concatenate([shard.lengths for shard in shards])
        self.num_bytes = np.concatenate([shard.num_bytes for shard in shards])
        self.ids = pa.chunked_array([chunk for shard in shards for chunk in shard.ids.chunks], pa.string())
        self._starts = np.cumsum([0] + [len(shard) for shard in shards])

    def __len__(self) -> int:
        return len(self.lengths)

    def document(self, index: int) -> np.ndarray:
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.shards[shard].document(index - int(self._starts[shard]))

    def locate(self, documents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, index within that shard) of each of the source's `documents`."""
        shard = np.searchsorted(self._starts, documents, side="right") - 1
        return shard, documents - self._starts[shard]

    def open(self) -> SourceTokens:
        """Itself: the tokens are open (`SourceIndex.open` is the form a task calls)."""
        return self


@dataclass(frozen=True)
class ShardRef:
    """A token shard in the lake named rather than opened, so any process (a Ray task) can open it."""

    lake_url: str
    stage: str
    source: str
    key: str

    def open(self) -> TokenShard:
        return TokenShard.open(Lake(self.lake_url).local_slice(self.stage, self.source), self.key)

    def lengths(self) -> np.ndarray:
        """Its documents' lengths (tokens, EOS included), from the index alone."""
        lake = Lake(self.lake_url)
        with lake.fs.open(
            lake.shard_path(self.stage, self.source, self.key, ".index.parquet"), "rb"
        ) as handle:
            return pq.read_table(handle, columns=["length"])["length"].to_numpy()


class SourceIndex:
    """A source's token shards as the sampler and the packing plan see them: each document's length, and
    where its shard lies. The lengths come from tasks that read the indexes (`gather`); the tokens stay in
    the lake until a packing task opens them (`open`). 8 bytes a document here, where `SourceTokens`
    also holds ids, offsets and byte counts."""

    def __init__(self, source: str, refs: list[ShardRef], lengths: list[np.ndarray]) -> None:
        if not refs:
            raise ValueError(f"source {source!r} has no token shard")
        self.source, self.refs = source, tuple(refs)
        self.lengths = np.concatenate(lengths)

    @classmethod
    def gather(cls, lake: Lake, stage: str, keys: dict[str, list[str]]) -> dict[str, SourceIndex]:
        """Each source's index from its shards (`keys`, in order) under `stage`, read in tasks."""
        refs = {
            source: [ShardRef(lake.url, stage, source, key) for key in names]
            for source, names in keys.items()
        }
        everything = [ref for source in refs for ref in refs[source]]
        lengths = iter(map_tasks(ShardRef.lengths, everything))
        return {source: cls(source, mine, [next(lengths) for _ in mine]) for source, mine in refs.items()}

    def __len__(self) -> int:
        return len(self.lengths)

    def open(self) -> SourceTokens:
        return SourceTokens(self.source, [ref.open() for ref in self.refs])

    def __getstate__(self) -> dict:
        # A packing task needs the shards, not the lengths it is sent with.
        return {"source": self.source, "refs": self.refs, "lengths": None}
