"""Build the tokenised training mixture: held-out split, token shards, sampled and packed sequences.

The files under `out_dir` are a contract with the trainer (moe_dag/training/data.py reads them; nothing
else under `out_dir` is read outside this package):

    train.npy        [num_sequences, seq_len + 1] token ids, dtype uint16 (vocab <= 65536) or uint32;
                     row r is inputs r[:-1] and targets r[1:]; open with np.load(path, mmap_mode="r").
                     The rows are the sampler's stream cut in order, never shuffled: the trainer reads
                     them in file order, so every prefix of training keeps the target shares.
    train_source_tokens.npy
                     [num_sequences, len(source_columns)] int32: tokens of each source in each row
    train_plan.npy   [draws, 2] int64: the sampler's draws in stream order, (column in source_columns,
                     document index in that source's token shards end to end); train.npy is these
                     documents back to back, cut into rows. 16 bytes a draw, where the packer once kept
                     a Python tuple of about 100.
    sequences/part-00000.parquet
                     the rows' documents, one line per piece of a document in a row: sequence (row of
                     train.npy), position (the piece's first token in the row), source, document_id,
                     token_start and token_end (the piece's span in the document's tokens, EOS included):
                     train.npy row r is its pieces' spans of their token shards' documents, in position
                     order. What a catalog view traces a document's tokens to the sequences with.
    heldout.parquet  source, id, tokens (list<int32>: the document's tokens + EOS), num_bytes (UTF-8 bytes
                     of its text): the documents kept out of training (and out of the tokenizer's
                     training text), for bits-per-byte evaluation; see heldout.py for how many
    mixture.json     the report: seq_len, vocab_size, eos_id, dtype, num_sequences, total_tokens,
                     source_columns, per source {target_share, achieved_share, tokens, documents, epochs,
                     train_documents, heldout_documents, trained, ...}, warnings, sampler_state, config
    shards/          one token shard per source (see token_shards.py); when the engine tokenised the
                     lake's shards in parallel, they lie in the lake instead and `pack_mixture` reads them

Token budget. With `total_tokens` set, the build packs total_tokens // (seq_len + 1) sequences. With it
None, the budget is the largest one at which every source still meets its share: documents are drawn
until the first source reaches its `max_epochs` cap. Either way a source that hits its cap while others
go on is flagged `short` in the report (the asset check `sources_within_epoch_cap` says so).

Every step is a function of the inputs and the config, and nothing in the report depends on the clock or
the output path, so rebuilding with the same inputs rewrites byte-identical files.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer
from tqdm import tqdm

from moe_dag.engine.tasks import map_tasks
from moe_dag.mixture.heldout import HELDOUT_MAX_SHARE, heldout_count, split_heldout
from moe_dag.mixture.sampler import MixtureSampler, check_weights
from moe_dag.mixture.token_shards import (
    SourceIndex,
    SourceTokens,
    encode_stream,
    token_dtype,
    write_token_shard,
)
from moe_dag.mixture.tokenizer import eos_id
from moe_dag.storage.atomic import atomic_path
from moe_dag.storage.lake import PART_NAME, Lake

TRAIN_FILE = "train.npy"
HELDOUT_FILE = "heldout.parquet"
REPORT_FILE = "mixture.json"
SHARDS_DIR = "shards"
SOURCE_TOKENS_FILE = "train_source_tokens.npy"
PLAN_FILE = "train_plan.npy"
# A folder of its own, so the lake sees one table there (`tokenized_mixture/sequences` in the catalog).
SEQUENCES_FILE = f"sequences/{PART_NAME}"
# Tokens per packing chunk. A chunk's task holds about 20 bytes a token of gather positions (_pack_rows),
# so 2^20 keeps a packing worker within ~25 MB of its baseline at any corpus size (2^22 took ~110 MB at 16x
# the demo corpus), and a mixture of a few million tokens still makes enough chunks for every worker.
PACK_CHUNK_TOKENS = 1 << 20

SEQUENCES_SCHEMA = pa.schema(
    [
        pa.field("sequence", pa.int64(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("document_id", pa.string(), nullable=False),
        pa.field("token_start", pa.int64(), nullable=False),
        pa.field("token_end", pa.int64(), nullable=False),
    ]
)

HELDOUT_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("num_bytes", pa.int64(), nullable=False),
    ]
)


@dataclass(kw_only=True)
class MixtureConfig:
    weights: dict[str, float]
    seq_len: int = 128
    total_tokens: int | None = None
    seed: int = 0
    max_epochs: float = 4.0
    heldout_fraction: float = 0.05
    # Held out per source at least this many documents, but never more than `heldout_max_share` of the
    # source, so a small source still trains (1.0: a source smaller than the minimum is held out whole).
    heldout_min_documents: int = 50
    heldout_max_share: float = HELDOUT_MAX_SHARE
    # The end-of-document token appended after every document; a pretrained tokenizer may name it differently.
    eos_token: str = "<|endoftext|>"

    def __post_init__(self) -> None:
        # Checked when the config is made (the pipeline config loads), not at the mixture stage.
        if self.seq_len < 1:
            raise ValueError(f"MixtureConfig.seq_len must be at least 1, got {self.seq_len}")
        if self.total_tokens is not None and self.total_tokens < self.seq_len + 1:
            raise ValueError(
                f"MixtureConfig.total_tokens={self.total_tokens} does not fill one sequence of "
                f"seq_len + 1 = {self.seq_len + 1} tokens"
            )
        # raises on bad values
        heldout_count(0, self.heldout_fraction, self.heldout_min_documents, self.heldout_max_share)


def build_mixture(
    documents: dict[str, pa.Table], tokenizer: Tokenizer, config: MixtureConfig, out_dir: Path
) -> dict:
    """Write train.npy, heldout.parquet, mixture.json and shards/ under `out_dir`; return the report.

    `documents` maps each source to its kept documents (columns `id` and `text`, others ignored)."""
    _validate(config, documents)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos = eos_id(tokenizer, config.eos_token)
    sources: dict[str, SourceTokens] = {}
    heldout_parts: list[pa.Table] = []
    for source in sorted(documents):
        train, held = split_heldout(
            documents[source], config.heldout_fraction, config.heldout_min_documents, config.heldout_max_share
        )
        shard = write_token_shard(train, tokenizer, eos, out_dir / SHARDS_DIR, source)
        sources[source] = SourceTokens(source, [shard])
        heldout_parts.append(heldout_table(held, tokenizer, eos, source))
    heldout = pa.concat_tables([HELDOUT_SCHEMA.empty_table(), *heldout_parts])
    return pack_mixture(
        sources, heldout, tokenizer.get_vocab_size(with_added_tokens=True), eos, config, out_dir
    )


def pack_mixture(
    sources: dict[str, SourceTokens | SourceIndex],
    heldout: pa.Table | HeldoutSlices,
    vocab_size: int,
    eos: int,
    config: MixtureConfig,
    out_dir: Path,
) -> dict:
    """Sample and pack tokenised sources into train.npy, write heldout.parquet and mixture.json.

    With open `SourceTokens` and a held-out table in memory, everything runs in this process (the packing
    on a thread per core). With `SourceIndex`es and `HeldoutSlices` from the lake, this process draws the
    plan from the documents' lengths alone; Ray tasks on this machine (which holds `out_dir`) write the
    held-out file and pack the rows from the plan (`map_tasks`, in this process without Ray)."""
    check_weights(config.weights, sources)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout_counts = _write_heldout(heldout, out_dir / HELDOUT_FILE)
    held = set(heldout_counts)
    emptied = sorted(source for source, tokens in sources.items() if not len(tokens) and source not in held)
    if emptied:
        # Training without a configured source would quietly change every other source's share.
        raise ValueError(
            f"sources {emptied} kept no documents: the source_not_emptied checks of the curation stages "
            "name the stage and the reasons; loosen those rules for the source, or remove it from sources"
        )
    # A source held out whole is scored but never trained on; the rest share its weight.
    lengths = {source: tokens.lengths for source, tokens in sources.items() if len(tokens)}
    if not lengths:
        raise ValueError(
            f"every source is held out whole (heldout_min_documents={config.heldout_min_documents}, "
            f"heldout_max_share={config.heldout_max_share}): "
            "nothing is left to train on"
        )
    weights = {source: config.weights[source] for source in lengths}
    sampler = MixtureSampler(lengths, weights, seed=config.seed, max_epochs=config.max_epochs)
    row = config.seq_len + 1
    wanted = None if config.total_tokens is None else config.total_tokens // row * row
    columns = {source: column for column, source in enumerate(sorted(sources))}
    plan, capped_at, stream_tokens = _draw(sampler, lengths, columns, wanted)
    num_sequences = stream_tokens // row if wanted is None else min(wanted, stream_tokens) // row
    if num_sequences == 0:
        raise ValueError(f"the mixture drew {stream_tokens} tokens, less than one sequence of {row}")
    dtype = token_dtype(vocab_size)
    packed = _pack(plan, sources, num_sequences, row, dtype, out_dir)

    report = {"vocab_size": vocab_size, "eos_id": eos, "dtype": dtype.name, "source_columns": sorted(sources)}
    report |= _report(
        config, sampler, sources, heldout_counts, packed, plan, capped_at, num_sequences, wanted
    )
    with atomic_path(out_dir / REPORT_FILE) as partial:
        partial.write_text(json.dumps(report, indent=2) + "\n")
    return report


def heldout_table(table: pa.Table, tokenizer: Tokenizer, eos: int, source: str) -> pa.Table:
    """`table`'s documents (`id`, `text`) as held-out rows of HELDOUT_SCHEMA: tokens with EOS, UTF-8 bytes."""
    texts = table["text"].to_pylist()
    stream, lengths = encode_stream(tokenizer, texts, eos, np.dtype(np.int32))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(stream, pa.int32()))
    columns = {
        "source": [source] * len(texts),
        "id": table["id"].cast(pa.string()),
        "tokens": tokens,
        "num_bytes": pc.binary_length(table["text"]).cast(pa.int64()),
    }
    return pa.table(columns, schema=HELDOUT_SCHEMA)


def _draw(
    sampler: MixtureSampler, lengths: dict[str, np.ndarray], columns: dict[str, int], wanted: int | None
) -> tuple[np.ndarray, dict[str, int], int]:
    """The sampled order as [draws, 2] (source column, document), after how many draws each capped source
    hit its cap, and the tokens drawn.

    Stops once the stream holds `wanted` tokens, or (wanted None) as soon as the first source is capped,
    or when every source is capped."""
    drawn = array.array("q")  # column, document, column, document, ...: 16 bytes a draw
    capped_at: dict[str, int] = {}
    stream_tokens = 0
    with tqdm(total=wanted, desc="sample mixture", unit="tok", disable=None) as progress:
        for source, document in sampler:
            drawn.extend((columns[source], document))
            length = int(lengths[source][document])
            stream_tokens += length
            progress.update(length)
            if source in sampler.exhausted:
                capped_at[source] = len(drawn) // 2
                if wanted is None:
                    break
            if wanted is not None and stream_tokens >= wanted:
                break
    return np.frombuffer(drawn, dtype=np.int64).reshape(-1, 2), capped_at, stream_tokens


def _pack(
    plan: np.ndarray,
    shards: dict[str, SourceTokens | SourceIndex],
    num_sequences: int,
    row: int,
    dtype: np.dtype,
    out_dir: Path,
) -> dict[str, int]:
    """Write the plan to train_plan.npy, then its documents back to back cut into `num_sequences` rows of
    `row` tokens (the tail that does not fill a row is dropped) in train.npy, each row's tokens per
    source in train_source_tokens.npy and its documents' pieces in sequences.parquet. Returns the tokens
    each source put into train.npy.

    The rows are packed in chunks, each a function of its slice of the plan alone (`_pack_chunk`): Ray
    tasks on this machine for sources in the lake, threads here for open ones (the copies are numpy
    gathers, which run without the GIL). Each chunk's task gets only the draws that overlap it."""
    names = sorted(shards)
    lengths_P = np.zeros(len(plan), dtype=np.int64)
    for column, source in enumerate(names):
        drawn = plan[:, 0] == column
        lengths_P[drawn] = shards[source].lengths[plan[drawn, 1]]
    ends_P = np.cumsum(lengths_P)  # each draw's end in the stream
    starts_P = ends_P - lengths_P
    with atomic_path(out_dir / PLAN_FILE) as plan_partial, plan_partial.open("wb") as handle:
        np.save(handle, plan)
    with atomic_path(out_dir / TRAIN_FILE) as partial:
        np.lib.format.open_memmap(partial, mode="w+", dtype=dtype, shape=(num_sequences, row)).flush()
        chunk = max(1, PACK_CHUNK_TOKENS // row)
        jobs = []
        for first in range(0, num_sequences, chunk):
            rows = min(chunk, num_sequences - first)
            begin, end = first * row, (first + rows) * row
            low = int(np.searchsorted(ends_P, begin, side="right"))
            high = int(np.searchsorted(starts_P, end, side="left"))
            jobs.append(_PackJob(first, rows, plan[low:high], starts_P[low:high], lengths_P[low:high]))
        in_memory = any(isinstance(shards[source], SourceTokens) for source in names)
        packed = map_tasks(
            functools.partial(_pack_chunk, partial, row, [shards[source] for source in names]),
            jobs,
            workers=0 if in_memory else None,
            this_node=True,
            threads=True,
        )
        counts = [chunk_counts for chunk_counts, _ in packed]
        source_tokens = np.concatenate([np.zeros((0, len(names)), dtype=np.int32), *counts])
        pieces = pa.concat_tables([SEQUENCES_SCHEMA.empty_table(), *(chunk for _, chunk in packed)])
        _write_parquet(pieces, out_dir / SEQUENCES_FILE)
        with atomic_path(out_dir / SOURCE_TOKENS_FILE) as counts_partial, counts_partial.open("wb") as handle:
            np.save(handle, source_tokens)
    totals = source_tokens.sum(axis=0, dtype=np.int64)
    return {source: int(totals[column]) for column, source in enumerate(names)}


@dataclass(frozen=True)
class _PackJob:
    first: int  # the chunk's first row
    rows: int
    plan: np.ndarray  # the draws that overlap the chunk, with their starts and lengths in the stream
    starts_P: np.ndarray
    lengths_P: np.ndarray


def _pack_chunk(
    train_path: Path, row: int, sources: list[SourceTokens | SourceIndex], job: _PackJob
) -> tuple[np.ndarray, pa.Table]:
    """Fill rows `job.first` onwards of the train.npy at `train_path` (made, at its full size, by the
    caller); returns their tokens per source, [rows, sources], and their pieces (SEQUENCES_SCHEMA)."""
    train = np.load(train_path, mmap_mode="r+")
    counts_RS = np.zeros((job.rows, len(sources)), dtype=np.int32)
    rows_RT = train[job.first : job.first + job.rows]
    opened = [s.open() for s in sources]
    begin = job.first * row
    _pack_rows(job.plan, job.starts_P, job.lengths_P, opened, rows_RT, counts_RS, begin)
    rows_RT.flush()
    return counts_RS, _row_pieces(job, opened, row, begin, begin + job.rows * row)


def _row_pieces(job: _PackJob, sources: list[SourceTokens], row: int, begin: int, end: int) -> pa.Table:
    """The pieces of the draws in stream positions [begin, end) cut at every row boundary: which
    document's tokens fill which part of which row (SEQUENCES_SCHEMA)."""
    starts_P = job.starts_P
    low_P = np.maximum(starts_P, begin)
    high_P = np.minimum(starts_P + job.lengths_P, end)
    inside = high_P > low_P
    draws = np.flatnonzero(inside)
    first_row_P, last_row_P = low_P[draws] // row, (high_P[draws] - 1) // row
    per_draw = last_row_P - first_row_P + 1
    draw_Q = np.repeat(draws, per_draw)  # one entry per piece
    sequence_Q = (
        np.repeat(first_row_P, per_draw)
        + np.arange(int(per_draw.sum()))
        - np.repeat(np.cumsum(per_draw) - per_draw, per_draw)
    )
    piece_start_Q = np.maximum(low_P[draw_Q], sequence_Q * row)
    piece_end_Q = np.minimum(high_P[draw_Q], (sequence_Q + 1) * row)
    column_Q, document_Q = job.plan[draw_Q, 0], job.plan[draw_Q, 1]
    ids = np.empty(len(draw_Q), dtype=object)
    names = np.empty(len(draw_Q), dtype=object)
    for column, source in enumerate(sources):
        mine = column_Q == column
        ids[mine] = source.ids.take(pa.array(document_Q[mine])).to_numpy(zero_copy_only=False)
        names[mine] = source.source
    columns = {
        "sequence": sequence_Q,
        "position": (piece_start_Q - sequence_Q * row).astype(np.int32),
        "source": pa.array(names, pa.string()),
        "document_id": pa.array(ids, pa.string()),
        "token_start": piece_start_Q - starts_P[draw_Q],
        "token_end": piece_end_Q - starts_P[draw_Q],
    }
    return pa.table(columns, schema=SEQUENCES_SCHEMA)


def _pack_rows(
    plan: np.ndarray,
    starts_P: np.ndarray,
    lengths_P: np.ndarray,
    sources: list[SourceTokens],
    rows_RT: np.ndarray,
    counts_RS: np.ndarray,
    begin: int,
) -> None:
    """Fill `rows_RT` (the rows of the stream from position `begin`) and their tokens per source
    `counts_RS` from the draws that overlap them: per source and shard, one gather of their tokens."""
    out = rows_RT.reshape(-1)
    end = begin + len(out)
    column_T = np.zeros(len(out), dtype=np.min_scalar_type(len(sources)))
    first = int(np.searchsorted(starts_P + lengths_P, begin, side="right"))
    last = int(np.searchsorted(starts_P, end, side="left"))
    draws = np.arange(first, last)
    for column, source in enumerate(sources):
        mine = draws[plan[first:last, 0] == column]
        low = np.maximum(starts_P[mine], begin)  # the part of each document inside these rows
        taken = np.minimum(starts_P[mine] + lengths_P[mine], end) - low
        skipped = low - starts_P[mine]  # tokens of a document that began in the rows before
        shard_of, index = source.locate(plan[mine, 1])
        for s, shard in enumerate(source.shards):
            here = shard_of == s
            if not here.any():
                continue
            n = taken[here]
            # Positions within the chunk fit int32 (PACK_CHUNK_TOKENS); positions in the shard may not.
            within = np.arange(int(n.sum()), dtype=np.int32)
            within -= np.repeat((np.cumsum(n) - n).astype(np.int32), n)
            write = np.repeat((low[here] - begin).astype(np.int32), n)
            write += within
            read = np.repeat(shard.offsets[index[here]] + skipped[here], n)
            read += within
            del within
            out[write] = shard.tokens[read]
            column_T[write] = column
    by_row = column_T.reshape(rows_RT.shape)
    for column in range(len(sources)):
        counts_RS[:, column] = (by_row == column).sum(axis=1)


def _report(
    config: MixtureConfig,
    sampler: MixtureSampler,
    shards: dict[str, SourceTokens | SourceIndex],
    heldout_counts: Counter,
    packed: dict[str, int],
    plan: np.ndarray,
    capped_at: dict[str, int],
    num_sequences: int,
    wanted: int | None,
) -> dict:
    total = sum(packed.values())
    total_weight = sum(config.weights.values())
    sources = {}
    warnings = []
    for source, shard in shards.items():
        # Capped with draws after it: the other sources kept going, so this one's share fell short.
        short = source in capped_at and capped_at[source] < len(plan)
        achieved = packed[source] / total if total else 0.0
        trained = source in sampler.target_shares
        target = config.weights[source] / total_weight
        sources[source] = {
            "target_share": target,
            "achieved_share": achieved,
            "tokens": packed[source],
            "documents": sampler.documents_drawn[source] if trained else 0,
            "epochs": sampler.epochs[source] if trained else 0.0,
            "train_documents": len(shard),
            "heldout_documents": heldout_counts[source],
            "capped": source in capped_at,
            "short": short,
            "trained": trained,
        }
        if not trained:
            warnings.append(
                f"source {source!r} has only {heldout_counts[source]} documents, all held out for evaluation "
                f"(heldout_min_documents={config.heldout_min_documents}, heldout_max_share="
                f"{config.heldout_max_share}): it is scored but not trained on, "
                "and the other sources' shares grow to fill its target"
            )
    if wanted is not None and total < wanted:
        warnings.append(f"every source hit its epoch cap: packed {total} of the {wanted} tokens asked for")
    return {
        "seq_len": config.seq_len,
        "num_sequences": num_sequences,
        "total_tokens": total,
        "sources": sources,
        "warnings": warnings,
        "sampler_state": sampler.state_dict(),
        "config": dataclasses.asdict(config),
    }


@dataclass(frozen=True)
class HeldoutSlices:
    """The held-out documents as the tokenising tasks left them in the lake, one slice per source: written
    into heldout.parquet by a task (`write`), so this process never reads them."""

    lake_url: str
    stage: str
    sources: tuple[str, ...]

    def write(self, path: Path) -> Counter:
        """The sources' slices, in order, as one file at `path`; returns the documents per source."""
        lake = Lake(self.lake_url)
        table = pa.concat_tables(
            [HELDOUT_SCHEMA.empty_table(), *(lake.read_table(self.stage, source) for source in self.sources)]
        )
        _write_parquet(table, path)
        return Counter(table["source"].to_pylist())


def _write_heldout(heldout: pa.Table | HeldoutSlices, path: Path) -> Counter:
    """heldout.parquet at `path`; returns its documents per source."""
    if isinstance(heldout, HeldoutSlices):
        return map_tasks(heldout.write, [path], this_node=True)[0]
    _write_parquet(heldout, path)
    return Counter(heldout["source"].to_pylist())


def _write_parquet(table: pa.Table, path: Path) -> None:
    with atomic_path(path) as partial:
        pq.write_table(table, partial)


def _validate(config: MixtureConfig, documents: dict[str, pa.Table]) -> None:
    """Every user error, checked before the first (slow) tokenisation."""
    check_weights(config.weights, documents)
    for source, table in documents.items():
        for column in ("id", "text"):
            if column not in table.column_names:
                raise ValueError(f"documents of source {source!r} have no {column!r} column")
