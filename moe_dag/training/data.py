"""Reads the tokenized mixture that the data room writes, and serves deterministic training batches.

The contract (written by `moe_dag.data`), under one data directory:

- `mixture.json`: at least `seq_len`, `vocab_size`, `eos_id`, `num_sequences`.
- `train.npy`: uint16 or uint32, shape [num_sequences, seq_len + 1]; a row gives inputs row[:-1] and
  targets row[1:]. Opened memory-mapped, so the file can be larger than memory.
- `heldout.parquet`: columns source, id, tokens (list<int32>, ending with EOS), num_bytes (UTF-8 bytes
  of the document's text).

Batches: one endless stream of sequence indices, each epoch a fresh permutation seeded by (seed, epoch).
Each optimizer micro-step takes the next batch_size * world_size indices; rank r reads its own disjoint
batch_size of them. The stream position (`consumed`) is the whole state, so resuming is exact, and
the global order does not depend on the number of ranks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

_REQUIRED_KEYS = ("seq_len", "vocab_size", "eos_id", "num_sequences")


@dataclass(kw_only=True, slots=True, frozen=True)
class MixtureInfo:
    seq_len: int
    vocab_size: int
    eos_id: int
    num_sequences: int


def read_mixture(data_dir: Path) -> MixtureInfo:
    path = Path(data_dir) / "mixture.json"
    if not path.exists():
        raise ValueError(f"{path}: not found; is {data_dir} a tokenized mixture directory?")
    raw = json.loads(path.read_text())
    missing = [key for key in _REQUIRED_KEYS if key not in raw]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    return MixtureInfo(**{key: int(raw[key]) for key in _REQUIRED_KEYS})


def open_train_tokens(data_dir: Path, info: MixtureInfo) -> np.ndarray:
    path = Path(data_dir) / "train.npy"
    if not path.exists():
        raise ValueError(f"{path}: not found")
    tokens = np.load(path, mmap_mode="r")
    if tokens.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"{path}: dtype {tokens.dtype}, expected uint16 or uint32")
    expected = (info.num_sequences, info.seq_len + 1)
    if tokens.shape != expected:
        raise ValueError(
            f"{path}: shape {tokens.shape}, mixture.json says {expected} (num_sequences, seq_len+1)"
        )
    return tokens


def read_heldout(data_dir: Path) -> dict[str, list[Any]]:
    """The held-out documents as columns: source, id, tokens, num_bytes."""
    path = Path(data_dir) / "heldout.parquet"
    if not path.exists():
        raise ValueError(f"{path}: not found")
    table = pq.read_table(path)
    missing = {"source", "id", "tokens", "num_bytes"} - set(table.column_names)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return {name: table.column(name).to_pylist() for name in ("source", "id", "tokens", "num_bytes")}


class TrainBatches:
    """(inputs_BS, targets_BS) int64 batches for one data-parallel rank, deterministic for a seed."""

    def __init__(
        self, data_dir: Path, *, batch_size: int, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"data-parallel rank {rank} is outside world size {world_size}")
        self.info = read_mixture(data_dir)
        if self.info.num_sequences < 1:
            raise ValueError(f"{Path(data_dir) / 'mixture.json'}: num_sequences is 0, nothing to train on")
        self.tokens = open_train_tokens(data_dir, self.info)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.consumed = 0  # sequences taken from the global stream by all ranks together
        self._epoch, self._permutation = -1, np.empty(0, dtype=np.int64)

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, self.info.num_sequences)
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch, self._permutation = epoch, rng.permutation(self.info.num_sequences)
        return int(self._permutation[offset])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.consumed + self.rank * self.batch_size
        rows = [self._index(position) for position in range(start, start + self.batch_size)]
        self.consumed += self.batch_size * self.world_size
        batch_BS = torch.from_numpy(self.tokens[rows].astype(np.int64))
        return batch_BS[:, :-1], batch_BS[:, 1:]

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(f"checkpoint data seed {state['seed']} differs from train.seed {self.seed}")
        self.consumed = state["consumed"]
