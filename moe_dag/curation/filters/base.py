"""The filter interface and the loop that runs a list of filters over an Arrow table.

A filter answers one question per document: keep it (None) or drop it with a fixed reason code. Model
filters first score a whole batch at once (`score`), because a model call per document is slow; the
per-document `decide` then only compares those scores with thresholds. Rule filters may score nothing
and read the text in `decide`, or compute their statistics in `score` so they land in the output as
columns anyone can query later.

`run_filters` never deletes a row: it returns every input row with each filter's score columns plus
`keep` and `reason` (the first failing filter's code). A filter only sees the rows still kept, so its
score columns are null where an earlier filter already dropped the document.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from moe_dag.storage.schema import with_decisions


class DocumentFilter(ABC):
    """One keep-or-drop rule (or a small family of related rules) over document texts."""

    name: str
    # Every code `decide` can return, so a run can reject typos and a dashboard can list them up front.
    reasons: tuple[str, ...]
    # Columns besides `text` that `score` reads: table columns (`metadata`, `shard`) or an earlier filter's
    # score columns (`language`). Each arrives as a keyword argument, a list aligned with `texts`, all None
    # where the table has no such column.
    inputs: tuple[str, ...] = ()
    # True for a filter that cuts on the distribution of its source (percentiles of the source's scores).
    # `fit_to_source` fits it once per source before the source fans out over workers, so every shard is
    # decided against the same cuts; an unfitted one fits on the table `run_filters` gives it, after the
    # filters before it finished every chunk (a whole source in a plain loop).
    whole_table: bool = False

    def score(self, texts: list[str], **inputs: list[Any]) -> dict[str, np.ndarray]:
        """Named score columns for `texts`, one value per text. Filters that only read text return {}."""
        return {}

    @abstractmethod
    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        """None to keep the document, else the reason code that drops it; `scores` is this row's scores."""

    def fit(self, texts: list[str], **inputs: list[Any]) -> DocumentFilter:
        """A whole-table filter's cuts from the texts of its source that reach it (and their `inputs`
        columns, where the table has them); returns self."""
        raise TypeError(f"filter {self.name!r} cuts on fixed thresholds: it has nothing to fit")


def fit_to_source(
    filters: Sequence[DocumentFilter], batches: Iterable[pa.Table], max_documents: int
) -> list[DocumentFilter]:
    """Fit every whole-table filter on up to `max_documents` of the source (the first, in shard order),
    passed through the filters before it. Returns `filters`, the whole-table ones fitted."""
    sample = []
    rows = 0
    for batch in batches:
        sample.append(batch.slice(0, max_documents - rows))
        rows += sample[-1].num_rows
        if rows >= max_documents:
            break
    table = pa.concat_tables(sample, promote_options="default") if sample else None
    for position, doc_filter in enumerate(filters):
        if not doc_filter.whole_table:
            continue
        texts, inputs = [], {}
        if table is not None and table.num_rows:
            decided, _ = run_filters(table, filters[:position])
            kept = decided.filter(decided["keep"])
            texts = kept["text"].to_pylist()
            inputs = {name: kept[name].to_pylist() for name in doc_filter.inputs if name in kept.column_names}
        doc_filter.fit(texts, **inputs)
    return list(filters)


# Score columns gathered chunk by chunk: (rows, values, the filter that wrote them) per chunk.
_Scored = dict[str, list[tuple[np.ndarray, np.ndarray, "DocumentFilter"]]]


@dataclass
class FilterCounts:
    """What one filter saw and did in one run."""

    seen: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class FilterStats:
    """Documents in and kept, and each filter's counts, in the order the filters ran."""

    documents: int
    kept: int
    filters: dict[str, FilterCounts]

    def as_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "kept": self.kept,
            "dropped": self.documents - self.kept,
            "filters": {name: asdict(counts) for name, counts in self.filters.items()},
        }


def run_filters(
    table: pa.Table, filters: Sequence[DocumentFilter], *, chunk_rows: int = 1024
) -> tuple[pa.Table, FilterStats]:
    """Run `filters` in order over the `text` column; return all rows with scores, `keep` and `reason`."""
    if "text" not in table.column_names:
        raise ValueError(f"run_filters needs a 'text' column; the table has {table.column_names}")
    if table["text"].null_count:
        raise ValueError(f"run_filters: {table['text'].null_count} rows have a null 'text'")
    names = [f.name for f in filters]
    if len(set(names)) != len(names):
        raise ValueError(f"run_filters: filter names must be unique, got {names}")

    texts: list[str] = table["text"].to_pylist()
    keep = np.ones(len(texts), dtype=bool)
    reason: list[str | None] = [None] * len(texts)
    scored: _Scored = {}
    stats = FilterStats(documents=len(texts), kept=0, filters={f.name: FilterCounts() for f in filters})
    # Every filter runs over one chunk before the next chunk starts: per-document work such as word
    # splitting is then cached across filters (see `text.split_words`) with memory bounded by the chunk.
    for segment in _segments(filters):
        size = len(texts) if segment[0].whole_table else chunk_rows
        for chunk_start in range(0, len(texts), max(size, 1)):
            chunk = np.arange(chunk_start, min(chunk_start + size, len(texts)))
            for doc_filter in segment:
                start = time.perf_counter()
                rows = chunk[keep[chunk]]
                inputs = {name: _input_column(table, scored, name, rows) for name in doc_filter.inputs}
                counts = stats.filters[doc_filter.name]
                _apply_filter(doc_filter, texts, rows, inputs, keep, reason, scored, counts)
                counts.seconds += time.perf_counter() - start
    stats.kept = int(keep.sum())

    # A rerun over an already-scored table replaces its old score columns rather than duplicating them.
    table = table.drop_columns([name for name in scored if name in table.column_names])
    for name, parts in scored.items():
        table = table.append_column(name, _scatter(parts, len(texts)))
    return with_decisions(table, keep.tolist(), reason), stats


def _segments(filters: Sequence[DocumentFilter]) -> list[list[DocumentFilter]]:
    """Runs of filters that go chunk by chunk, each whole-table filter a run of its own."""
    segments: list[list[DocumentFilter]] = []
    for doc_filter in filters:
        if doc_filter.whole_table or not segments or segments[-1][0].whole_table:
            segments.append([doc_filter])
        else:
            segments[-1].append(doc_filter)
    return segments


def _input_column(table: pa.Table, scored: _Scored, name: str, rows: np.ndarray) -> list[Any]:
    """Column `name` (an earlier filter's scores first, then the table's) at `rows`; None where absent."""
    if name in scored:
        wanted, values = set(rows.tolist()), {}
        for part_rows, part_values, _ in reversed(scored[name]):  # the latest part usually holds them all
            values.update(zip(part_rows.tolist(), part_values.tolist(), strict=True))
            if wanted <= values.keys():
                break
        return [values.get(i) for i in rows.tolist()]
    if name in table.column_names:
        return table[name].take(pa.array(rows, pa.int64())).to_pylist()
    return [None] * len(rows)


def _apply_filter(
    doc_filter: DocumentFilter,
    texts: list[str],
    rows: np.ndarray,
    inputs: dict[str, list[Any]],
    keep: np.ndarray,
    reason: list[str | None],
    scored: _Scored,
    counts: FilterCounts,
) -> None:
    """Score and decide the still-kept `rows`, updating `keep`, `reason`, `scored` and `counts` in place."""
    scores = doc_filter.score([texts[i] for i in rows], **inputs)
    for name, values in scores.items():
        if name in ("keep", "reason") or (name in scored and scored[name][0][2] is not doc_filter):
            raise ValueError(f"filter {doc_filter.name!r}: score column {name!r} is already taken")
        if len(values) != len(rows):
            raise ValueError(
                f"filter {doc_filter.name!r}: score column {name!r} has {len(values)} values "
                f"for {len(rows)} documents"
            )
        scored.setdefault(name, []).append((rows, np.asarray(values), doc_filter))

    row_scores = {name: values.tolist() for name, values in scores.items()}
    counts.seen += len(rows)
    for j, i in enumerate(rows.tolist()):
        code = doc_filter.decide(texts[i], {name: values[j] for name, values in row_scores.items()})
        if code is None:
            continue
        if code not in doc_filter.reasons:
            raise ValueError(
                f"filter {doc_filter.name!r} returned reason {code!r}, not one of {doc_filter.reasons}"
            )
        keep[i] = False
        reason[i] = code
        counts.dropped[code] = counts.dropped.get(code, 0) + 1
    counts.kept = counts.seen - sum(counts.dropped.values())


def _scatter(parts: list[tuple[np.ndarray, np.ndarray, DocumentFilter]], length: int) -> pa.Array:
    """A column of `length` rows holding each part's values at its rows and null everywhere else."""
    rows = np.concatenate([part[0] for part in parts])
    values = np.concatenate([part[1] for part in parts])
    is_text = values.dtype == object or values.dtype.kind == "U"
    full = np.full(length, None, dtype=object) if is_text else np.zeros(length, dtype=values.dtype)
    full[rows] = values
    mask = np.ones(length, dtype=bool)
    mask[rows] = False
    if full.dtype.kind == "f":
        mask |= np.isnan(full)  # a score a filter could not compute (too short to identify, ...) is null
    return pa.array(full, mask=mask, type=pa.string() if is_text else None)
