"""Reads the tokenized mixture that the data room writes, and serves training batches in its order.

The contract (written by `moe_dag.mixture.build`), under one data directory:

- `mixture.json`: at least `seq_len`, `vocab_size`, `eos_id`, `num_sequences`; `source_columns` (the
  source names, in the column order of `train_source_tokens.npy`) when that file is present; optionally
  `sources: {name: {target_share, ...}}`, drawn beside the shares trained on.
- `train.npy`: uint16 or uint32, shape [num_sequences, seq_len + 1]; a row gives inputs row[:-1] and
  targets row[1:]. Rows are the sampler's document stream cut into consecutive pieces, so every prefix
  of rows keeps each source within about one document of its target share. Opened memory-mapped, so
  the file can be larger than memory.
- `train_source_tokens.npy` (optional): int32, shape [num_sequences, number of sources]: how many of
  each row's tokens came from each source. Lets the trainer log the shares it has trained on.
- `heldout.parquet`: columns source, id, tokens (list<int32>, ending with EOS), num_bytes (UTF-8 bytes
  of the document's text).

Batches: rows in the sampler's order, never shuffled. Each global micro-step takes G = batch_size x
world_size rows, one from each of G lanes: lane j starts at row j * N // G of the N rows and reads the
next row at every step, so after k steps the model has seen G windows of k consecutive rows of the
sampler's stream. A window keeps each source within about two documents of its target (the sampler
bounds every prefix to one document; a window is the difference of two prefixes, each cut inside a
document at worst), so the first k steps stay within 4 G L tokens of the target shares (L the longest
document), a share error that shrinks as 1 / k like a single stream's. Lanes rather than G consecutive
rows: consecutive rows share documents (a long document spans many), so batches of one or two
documents trained the demo proxy to 3.467 held-out bits per byte, against 3.274 with lanes and 3.253
with shuffled rows (same mixture and seed, 300 steps; the README's "Data order" has the intervals).
Lanes put G different documents in every batch. Rank r reads lanes [r B, (r + 1) B), so the order
depends on the global batch only, not on how it is split over ranks. After N // G steps every row
has been read once and each lane runs on into the next lane's rows: every pass has the same shares.
The stream position (`consumed`) and the lane count are the whole state, saved in every checkpoint,
so resuming continues the same order exactly.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

log = logging.getLogger(__name__)

_REQUIRED_KEYS = ("seq_len", "vocab_size", "eos_id", "num_sequences")
# Names the order in which batches read the rows: a checkpoint from another order cannot be resumed.
DATA_ORDER = "lanes-v1"
SOURCE_TOKENS_FILE = "train_source_tokens.npy"


@dataclass(kw_only=True, slots=True, frozen=True)
class MixtureInfo:
    seq_len: int
    vocab_size: int
    eos_id: int
    num_sequences: int
    source_columns: tuple[str, ...] = ()
    target_shares: dict[str, float] = field(default_factory=dict)


def read_mixture(data_dir: Path) -> MixtureInfo:
    path = Path(data_dir) / "mixture.json"
    if not path.exists():
        raise ValueError(f"{path}: not found; is {data_dir} a tokenized mixture directory?")
    raw = json.loads(path.read_text())
    missing = [key for key in _REQUIRED_KEYS if key not in raw]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    sizes = {key: int(raw[key]) for key in _REQUIRED_KEYS}
    targets = {name: float(row["target_share"]) for name, row in raw.get("sources", {}).items()}
    return MixtureInfo(**sizes, source_columns=tuple(raw.get("source_columns", ())), target_shares=targets)


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


def open_source_tokens(data_dir: Path, info: MixtureInfo) -> np.ndarray | None:
    """Tokens per (row, source) of train.npy, or None for a mixture written without them."""
    path = Path(data_dir) / SOURCE_TOKENS_FILE
    if not path.exists():
        return None
    counts = np.load(path, mmap_mode="r")
    expected = (info.num_sequences, len(info.source_columns))
    if counts.shape != expected:
        raise ValueError(
            f"{path}: shape {counts.shape}, mixture.json says {expected} (num_sequences, source_columns)"
        )
    return counts


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
    """(inputs_BS, targets_BS) int64 batches for one data-parallel rank, rows in the mixture's order."""

    def __init__(self, data_dir: Path, *, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"data-parallel rank {rank} is outside world size {world_size}")
        self.info = read_mixture(data_dir)
        if self.info.num_sequences < 1:
            raise ValueError(f"{Path(data_dir) / 'mixture.json'}: num_sequences is 0, nothing to train on")
        self.tokens = open_train_tokens(data_dir, self.info)
        self.source_tokens = open_source_tokens(data_dir, self.info)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.consumed = 0  # rows taken from the global stream by all ranks together
        self._trained_source_tokens = np.zeros(len(self.info.source_columns), dtype=np.int64)

    def warn_if_repeating(self, micro_steps: int) -> None:
        rows = micro_steps * self.batch_size * self.world_size
        if rows > self.info.num_sequences:
            log.warning(
                "the run reads %d rows, the mixture holds %d: it will pass over train.npy %.2f times",
                rows,
                self.info.num_sequences,
                rows / self.info.num_sequences,
            )

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        step_rows = self._rows(self.consumed, self.lanes)
        mine = step_rows[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        if self.source_tokens is not None:
            self._trained_source_tokens += self.source_tokens[step_rows].sum(axis=0, dtype=np.int64)
        self.consumed += len(step_rows)
        batch_BS = torch.from_numpy(self.tokens[mine].astype(np.int64))
        return batch_BS[:, :-1], batch_BS[:, 1:]

    @property
    def lanes(self) -> int:
        return self.batch_size * self.world_size

    def _lane_starts(self) -> np.ndarray:
        return lane_starts(self.info.num_sequences, self.lanes)

    def _rows(self, start: int, count: int) -> np.ndarray:
        """The rows of the global micro-step that begins at stream position `start`: one per lane."""
        return (self._lane_starts() + start // count) % self.info.num_sequences

    def source_shares(self) -> dict[str, float]:
        """Each source's share of the tokens trained on so far, by all ranks; empty without the counts."""
        total = int(self._trained_source_tokens.sum())
        if total == 0:
            return {}
        return {
            name: int(count) / total
            for name, count in zip(self.info.source_columns, self._trained_source_tokens, strict=True)
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "order": DATA_ORDER,
            "consumed": self.consumed,
            "num_sequences": self.info.num_sequences,
            "lanes": self.lanes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("order") != DATA_ORDER:
            raise ValueError(
                f"the checkpoint read the mixture in order {state.get('order')!r}, this trainer in "
                f"{DATA_ORDER!r} (it was written by another version); train in a fresh --out directory"
            )
        if state.get("num_sequences") != self.info.num_sequences:
            raise ValueError(
                f"the checkpoint read a mixture of {state.get('num_sequences')} sequences, this one has "
                f"{self.info.num_sequences}; train on another mixture in a fresh --out directory"
            )
        if state.get("lanes") != self.lanes:
            raise ValueError(
                f"the checkpoint read {state.get('lanes')} rows per step (batch_size x ranks), this run "
                f"{self.lanes}: another global batch reads the mixture in another order; keep the batch "
                "or train in a fresh --out directory"
            )
        self.consumed = state["consumed"]
        if self.source_tokens is not None:
            steps = self.consumed // self.lanes
            self._trained_source_tokens = sum(
                (self._window_tokens(int(start), steps) for start in self._lane_starts()),
                np.zeros(len(self.info.source_columns), dtype=np.int64),
            )

    def _window_tokens(self, start: int, length: int) -> np.ndarray:
        """Tokens per source in `length` consecutive rows from row `start`, wrapping around the end."""
        counts, n = self.source_tokens, self.info.num_sequences
        passes, rest = divmod(length, n)
        end = start + rest
        window = counts[start : min(end, n)].sum(axis=0, dtype=np.int64)
        if end > n:
            window += counts[: end - n].sum(axis=0, dtype=np.int64)
        return passes * counts.sum(axis=0, dtype=np.int64) + window


def lane_starts(num_sequences: int, lanes: int) -> np.ndarray:
    """The row each of `lanes` lanes starts at: lane j at j * N // G (see the module's "Batches")."""
    return np.arange(lanes) * num_sequences // lanes


def steps_reading_rows(
    rows: np.ndarray, *, num_sequences: int, lanes: int, grad_accum_steps: int, steps: int
) -> np.ndarray:
    """The optimizer steps (1-based, sorted, unique) of a run of `steps` steps whose micro-batches read any
    of `rows`, in TrainBatches' order: micro-step k reads row (start_j + k) mod N in every lane j, and
    step s takes micro-steps (s - 1) A .. s A - 1."""
    micro_steps = steps * grad_accum_steps
    first_reads = (np.asarray(rows)[:, None] - lane_starts(num_sequences, lanes)[None, :]) % num_sequences
    first_reads = first_reads.ravel()
    first_reads = first_reads[first_reads < micro_steps]
    passes = (micro_steps - 1 - first_reads) // num_sequences + 1  # reads of each (row, lane) in the run
    reads = np.repeat(first_reads, passes) + num_sequences * (
        np.arange(int(passes.sum())) - np.repeat(np.cumsum(passes) - passes, passes)
    )
    return np.unique(reads // grad_accum_steps + 1)
