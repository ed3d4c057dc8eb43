"""Fitted state of a source, stored in the lake and versioned: cuts fitted once, reused by every later run.

A whole-table filter (the perplexity cut: a model and percentiles of the source's own distribution) is
fitted on the source before the source fans out over shards. Fitting it again at every materialisation
would let a new shard move the cuts and flip the decision of a document decided long ago. So the fit is
an artefact of its own, per stage and source:

    fits/<stage>/source=<name>/<version>.safetensors  the fitted filters' arrays (the n-gram model's counts)
    fits/<stage>/source=<name>/<version>.json         their settings, cuts and the model's vocabulary
    fits/<stage>/source=<name>/current.json           which version the stage uses, and what it was fitted on

A fit is stored as data, never pickled: whoever can write the lake could otherwise make every machine
that runs the stage run a command of theirs. The version is a digest of the two stored files, so shards
record it in their completion params and are redone only when the version changes. A new fit is made
only when there is none, or when the source's settings changed since the stored one (which includes
`prefilter.refit`, the explicit refit: bump it for a source, or globally). `refit_changes` says
beforehand which stored decisions a refit would change.

`fit_source` fits on batches handed to this process (the reference, and `moe-dag refit`'s preview);
`fit_source_in_tasks` makes the same fit where the data is: Ray tasks take the fit sample in pieces of
whole row groups (at most `FIT_TASK_ROWS` rows each, so a sample that lies in a few large shards still
spreads over the workers), run the filters ahead of the fitted one on their piece and return the
positions of the rows that reach it (with the columns it reads); one task trains the perplexity model
on the reference rows; tasks score the rows that reached it, piece by piece; this process sets the cuts
from those scores. What comes back is positions, languages and one float per document of the fit
sample, never text.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import pickle
import posixpath
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import safetensors.numpy
from safetensors import SafetensorError

from moe_dag.curation.filters import DocumentFilter, fit_to_source, run_filters
from moe_dag.curation.filters.perplexity import NgramLanguageModel, PerplexityFilter
from moe_dag.engine.tasks import map_tasks
from moe_dag.engine.warm import kept
from moe_dag.storage.atomic import atomic_write
from moe_dag.storage.lake import Lake

FITS = "fits"
CURRENT = "current.json"
# The whole-table filters a fit can hold, by the kind its stored state names.
_STORED_KINDS = {"perplexity": PerplexityFilter}
# Rows of the fit sample one task takes at most, in whole row groups (a row group larger than this is a
# piece of its own): a shard of 10^5 documents, which language ID and the rules take minutes over, is
# then several tasks rather than one straggler.
FIT_TASK_ROWS = 20_000


@dataclass(frozen=True)
class _Piece:
    """Some consecutive row groups of one file, the fit sample's first `rows` rows of them."""

    path: str
    groups: tuple[int, ...]
    start: int  # the piece's first row in the file
    rows: int


_NO_CHANGE = pa.table({name: pa.array([], pa.string()) for name in ("id", "reason_before", "reason_after")})


@dataclass(frozen=True)
class SourceFit:
    """The fitted whole-table filters of one stage and source, with what they were fitted from."""

    version: str
    settings: str  # digest of the source's settings at fitting time
    documents: int  # documents of the source the fit saw (before the filters ahead of the fitted ones)
    filters: dict[str, DocumentFilter]  # by filter name

    def describe(self) -> dict:
        return {
            "version": self.version,
            "settings": self.settings,
            "documents": self.documents,
            "cuts": {
                name: [c if math.isfinite(c) else str(c) for c in getattr(f, "cuts", None) or ()]
                for name, f in self.filters.items()
            },
        }


def fit_source(
    filters: Sequence[DocumentFilter], batches: Iterable[pa.Table], max_documents: int, settings: str
) -> SourceFit:
    """Fit the whole-table filters among `filters` on the source (see `fit_to_source`)."""
    if not any(f.whole_table for f in filters):
        return _fit({}, settings, 0)
    counted = _Counted(batches, max_documents)
    fitted = fit_to_source(filters, counted, max_documents)
    return _fit({f.name: f for f in fitted if f.whole_table}, settings, counted.rows)


def fit_source_in_tasks(
    filters: Sequence[DocumentFilter],
    lake: Lake,
    stage: str,
    source: str,
    max_documents: int,
    settings: str,
    workers: int | None = None,
) -> SourceFit:
    """`fit_source` on the first `max_documents` rows of `stage`'s slice (in shard order), fitted where the
    data is (see the module docstring): the same fit, version included."""
    if not any(f.whole_table for f in filters):
        return _fit({}, settings, 0)
    files = lake.parquet_files(stage, source)
    groups = map_tasks(functools.partial(_row_groups, lake.url), files, workers=workers)
    pieces = _pieces(files, groups, max_documents)
    taken = sum(piece.rows for piece in pieces)
    fitted = list(filters)
    for position, doc_filter in enumerate(fitted):
        if not doc_filter.whole_table:
            continue
        if not isinstance(doc_filter, PerplexityFilter):
            raise TypeError(f"{doc_filter.name!r}: only the perplexity filter is fitted in tasks")
        reach = functools.partial(_reaching, lake.url, fitted[:position], doc_filter.inputs)
        reached = map_tasks(reach, pieces, workers=workers)
        fitted[position] = _fit_perplexity(doc_filter, lake.url, pieces, reached, workers)
    return _fit({f.name: f for f in fitted if f.whole_table}, settings, taken)


def _pieces(files: list[str], groups: list[list[int]], max_documents: int) -> list[_Piece]:
    """The first `max_documents` rows of `files` (whose row groups hold `groups` rows) in pieces of
    consecutive row groups of one file, each of at most FIT_TASK_ROWS rows unless one group holds more."""
    pieces, left = [], max_documents
    for path, sizes in zip(files, groups, strict=True):
        start, run, rows = 0, [], 0  # the piece being gathered: its first row, groups and rows
        for index, size in enumerate(sizes):
            if left <= 0:
                break
            if run and rows + min(size, left) > FIT_TASK_ROWS:
                pieces.append(_Piece(path, tuple(run), start, rows))
                start, run, rows = start + rows, [], 0
            run.append(index)
            rows += min(size, left)
            left -= min(size, left)
        if rows:
            pieces.append(_Piece(path, tuple(run), start, rows))
    return pieces


def _fit_perplexity(
    doc_filter: PerplexityFilter,
    lake_url: str,
    pieces: list[_Piece],
    reached: list[tuple[np.ndarray, dict[str, list]]],
    workers: int | None,
) -> PerplexityFilter:
    """`doc_filter.fit` on the rows that reached it, each step where the rows are."""
    documents = sum(len(positions) for positions, _ in reached)
    if documents < doc_filter.min_documents:
        return doc_filter.fit([])  # too few to cut: the same state as fitting on them
    rows = doc_filter.reference_rows(documents)
    if rows is None or doc_filter.reference_texts is not None:
        doc_filter.fit_model(doc_filter.reference_texts or [])
    else:
        # Global positions among the rows that reached the filter -> (file, row in the file).
        where = [
            (piece.path, piece.start + int(row))
            for piece, (positions, _) in zip(pieces, reached, strict=True)
            for row in positions
        ]
        [doc_filter.model] = map_tasks(
            functools.partial(_train_model, lake_url, doc_filter.order),
            [[where[i] for i in rows]],
            workers=workers,
        )
    score = functools.partial(_perplexities, lake_url, doc_filter.model)
    scores = map_tasks(
        score,
        [(piece, positions) for piece, (positions, _) in zip(pieces, reached, strict=True)],
        workers=workers,
    )
    languages = [language for _, inputs in reached for language in inputs.get("language", [])]
    return doc_filter.fit_cuts(np.concatenate([np.zeros(0), *scores]), languages or None)


def _row_groups(lake_url: str, path: str) -> list[int]:
    """Rows of each row group of one file."""
    with Lake(lake_url).fs.open(path, "rb") as handle:
        metadata = pq.ParquetFile(handle).metadata
        return [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]


def _read_piece(lake_url: str, piece: _Piece, columns: list[str] | None = None) -> pa.Table:
    with Lake(lake_url).fs.open(piece.path, "rb") as handle:
        return (
            pq.ParquetFile(handle).read_row_groups(list(piece.groups), columns=columns).slice(0, piece.rows)
        )


def _reaching(
    lake_url: str, before: list[DocumentFilter], inputs: tuple[str, ...], piece: _Piece
) -> tuple[np.ndarray, dict[str, list]]:
    """Positions in one piece of the rows `before` keeps, and the `inputs` columns of those rows."""
    decided, _ = run_filters(_read_piece(lake_url, piece), _warm(before))
    positions = np.flatnonzero(decided["keep"].to_numpy(zero_copy_only=False)).astype(np.int64)
    kept = decided.take(positions)
    return positions, {name: kept[name].to_pylist() for name in inputs if name in kept.column_names}


def _warm(filters: list[DocumentFilter]) -> list[DocumentFilter]:
    """The copy of `filters` this worker process ran before if its pickled state is the same (its
    language ID models loaded), else `filters`, kept for the next call. Every task group unpickles its
    own copy, whose models would load again (py3langid's about 0.6 s of CPU a load; 8 groups a phase on
    2 workers); equal state is the test, so a changed setting never reuses one."""
    key = "fit filters " + hashlib.blake2b(pickle.dumps(filters, protocol=5), digest_size=16).hexdigest()
    return kept(key, lambda: filters)


def _texts(lake: Lake, path: str, rows: list[int]) -> list[str]:
    return lake.read_file(path, ["text"])["text"].take(rows).to_pylist()


def _train_model(lake_url: str, order: int, where: list[tuple[str, int]]) -> NgramLanguageModel:
    """The perplexity model trained on the texts at `where` (file, row), in that order."""
    lake, texts = Lake(lake_url), {}
    for path in dict.fromkeys(path for path, _ in where):
        rows = sorted({row for p, row in where if p == path})
        texts.update(zip(((path, row) for row in rows), _texts(lake, path, rows), strict=True))
    return NgramLanguageModel.fit([texts[place] for place in where], order=order)


def _perplexities(lake_url: str, model: NgramLanguageModel, rows: tuple[_Piece, np.ndarray]) -> np.ndarray:
    piece, positions = rows
    texts = (
        _read_piece(lake_url, piece, ["text"])["text"].take(positions).to_pylist() if len(positions) else []
    )
    return np.array([model.perplexity(text) for text in texts], dtype=np.float64)


def with_fit(filters: Sequence[DocumentFilter], fit: SourceFit) -> list[DocumentFilter]:
    """`filters` with each whole-table one replaced by its fitted copy from `fit`."""
    missing = [f.name for f in filters if f.whole_table and f.name not in fit.filters]
    if missing:
        raise ValueError(f"fit {fit.version} holds no fitted {missing}: refit the source (prefilter.refit)")
    return [fit.filters[f.name] if f.whole_table else f for f in filters]


def load_fit(lake: Lake, stage: str, source: str) -> SourceFit | None:
    """The fit `stage` uses for `source`, or None before the first. A version whose state files are
    missing (one pickled before fits were data) counts as none: the stage fits again, which on the same
    rows and settings gives the same cuts. Files that are not a stored fit are refused with their path."""
    folder = _folder(lake, stage, source)
    try:
        with lake.fs.open(posixpath.join(folder, CURRENT), "rb") as handle:
            current = json.loads(handle.read())
        version = current["version"]
        values_path = posixpath.join(folder, f"{version}.json")
        arrays_path = posixpath.join(folder, f"{version}.safetensors")
        values_bytes, arrays_bytes = lake.fs.cat_file(values_path), lake.fs.cat_file(arrays_path)
    except FileNotFoundError:
        return None
    try:
        values = json.loads(values_bytes)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{values_path}: not a stored fit ({error})") from error
    try:
        arrays = safetensors.numpy.load(arrays_bytes)
    except SafetensorError as error:
        raise ValueError(f"{arrays_path}: not a stored fit ({error})") from error
    try:
        filters = {
            name: _STORED_KINDS[state["kind"]].from_state(state, _prefixed(arrays, name))
            for name, state in values["filters"].items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{values_path}: not a stored fit ({type(error).__name__}: {error})") from error
    return SourceFit(version, current["settings"], current["documents"], filters)


def store_fit(lake: Lake, stage: str, source: str, fit: SourceFit) -> None:
    """Write the fit's version (kept beside earlier ones), then point `current.json` at it."""
    folder = _folder(lake, stage, source)
    values, arrays = _encoded(fit.filters)
    with atomic_write(posixpath.join(folder, f"{fit.version}.safetensors"), lake.fs) as handle:
        handle.write(arrays)
    with atomic_write(posixpath.join(folder, f"{fit.version}.json"), lake.fs) as handle:
        handle.write(values)
    with atomic_write(posixpath.join(folder, CURRENT), lake.fs) as handle:
        handle.write(json.dumps(fit.describe(), sort_keys=True).encode())


def _encoded(filters: dict[str, DocumentFilter]) -> tuple[bytes, bytes]:
    """The whole-table filters as stored: JSON values, and safetensors arrays named `<filter>/<array>`."""
    values, arrays = {}, {}
    for name, doc_filter in filters.items():
        kind = next((kind for kind, cls in _STORED_KINDS.items() if type(doc_filter) is cls), None)
        if kind is None:
            raise TypeError(f"{name!r}: a {type(doc_filter).__name__} cannot be stored as a fit")
        state, own = doc_filter.state()
        values[name] = {"kind": kind, **state}
        arrays.update({f"{name}/{key}": np.ascontiguousarray(array) for key, array in own.items()})
    return json.dumps({"filters": values}, sort_keys=True).encode(), safetensors.numpy.save(arrays)


def _prefixed(arrays: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    return {
        key.removeprefix(f"{name}/"): array for key, array in arrays.items() if key.startswith(f"{name}/")
    }


def decisions(lake: Lake, stage: str, source: str) -> pa.Table:
    """id, keep and reason of every row of the stage's slice (empty before the first run)."""
    if not lake.has_table(stage, source):
        return pa.table(
            {
                "id": pa.array([], pa.string()),
                "keep": pa.array([], pa.bool_()),
                "reason": pa.array([], pa.string()),
            }
        )
    return lake.read_table(stage, source, columns=["id", "keep", "reason"])


class DecisionsBefore:
    """The decisions of a stage's slice kept aside before a refit rewrites it, to count what changed.

    Copied and compared shard by shard in Ray tasks (a document's id stays in its shard's file), so the
    slice never comes into this process: `changes` returns counts per "reason_before -> reason_after"."""

    def __init__(self, lake: Lake, stage: str, source: str) -> None:
        self.lake, self.stage, self.source = lake, stage, source
        self.folder = posixpath.join(_folder(lake, stage, source), "decisions_before")
        if lake.fs.exists(self.folder):
            lake.fs.rm(self.folder, recursive=True)
        files = lake.parquet_files(stage, source) if lake.has_table(stage, source) else []
        map_tasks(functools.partial(_copy_decisions, lake.url, self.folder), files)

    def changes(self) -> dict[str, int]:
        """Changed decisions of the documents in the slice both before and now, then forgets the copy."""
        copies = (
            self.lake.files_matching(self.folder, "*.parquet") if self.lake.fs.exists(self.folder) else []
        )
        now = self.lake.dataset_dir(self.stage, self.source)
        pairs = [(copy, posixpath.join(now, posixpath.basename(copy))) for copy in copies]
        totals: dict[str, int] = {}
        for counts in map_tasks(functools.partial(_changes, self.lake.url), pairs):
            for key, count in counts.items():
                totals[key] = totals.get(key, 0) + count
        if copies:
            self.lake.fs.rm(self.folder, recursive=True)
        return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def _copy_decisions(lake_url: str, folder: str, path: str) -> None:
    lake = Lake(lake_url)
    lake.write_file(
        lake.read_file(path, ["id", "keep", "reason"]), posixpath.join(folder, posixpath.basename(path))
    )


def _changes(lake_url: str, pair: tuple[str, str]) -> dict[str, int]:
    lake, (before, now) = Lake(lake_url), pair
    if not lake.fs.exists(now):
        return {}
    return change_counts(
        changed_decisions(lake.read_file(before), lake.read_file(now, ["id", "keep", "reason"]))
    )


def changed_decisions(before: pa.Table, after: pa.Table) -> pa.Table:
    """The documents in both tables whose keep or reason differs: id, reason_before, reason_after
    (a kept document's reason is "kept")."""
    old = _with_named_reason(before).rename_columns(["id", "reason_before"])
    new = _with_named_reason(after).rename_columns(["id", "reason_after"])
    joined = old.join(new, "id", join_type="inner")
    changed = joined.filter(pc.not_equal(joined["reason_before"], joined["reason_after"]))
    return changed.select(_NO_CHANGE.column_names).cast(_NO_CHANGE.schema).sort_by("id")


def change_counts(changed: pa.Table) -> dict[str, int]:
    """Changed decisions counted per "reason_before -> reason_after"."""
    counts: dict[str, int] = {}
    for before, after in zip(
        changed["reason_before"].to_pylist(), changed["reason_after"].to_pylist(), strict=True
    ):
        key = f"{before} -> {after}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def refit_changes(lake: Lake, stage: str, source: str, filters: Sequence[DocumentFilter]) -> pa.Table:
    """Which stored decisions of the slice `filters` (the refitted ones) would change, without writing.

    Only the rows that reached the first whole-table filter are decided again (from the stored rows,
    whose earlier score columns the later filters read); a row dropped before it keeps its reason."""
    first = next((i for i, f in enumerate(filters) if f.whole_table), None)
    if first is None or not lake.has_table(stage, source):
        return _NO_CHANGE
    late = list(filters[first:])
    late_reasons = pa.array(sorted({reason for f in late for reason in f.reasons}), pa.string())
    changed = []
    for batch in lake.iter_batches(stage, source):
        reached = batch.filter(pc.or_kleene(batch["keep"], pc.is_in(batch["reason"], late_reasons)))
        if not reached.num_rows:
            continue
        decided, _ = run_filters(reached, late)
        changed.append(changed_decisions(reached.select(["id", "keep", "reason"]), decided))
    return pa.concat_tables([_NO_CHANGE, *changed]).sort_by("id")


def _fit(filters: dict[str, DocumentFilter], settings: str, documents: int) -> SourceFit:
    values, arrays = _encoded(filters)
    version = hashlib.blake2b(values + arrays, digest_size=8).hexdigest()
    return SourceFit(version, settings, documents, filters)


def _with_named_reason(table: pa.Table) -> pa.Table:
    reason = pc.if_else(table["keep"], pa.scalar("kept"), pc.fill_null(table["reason"], "dropped"))
    return pa.table({"id": table["id"], "reason": reason})


def _folder(lake: Lake, stage: str, source: str) -> str:
    return posixpath.join(lake.root, FITS, stage, f"source={source}")


class _Counted:
    """The batches of a source, counting the rows handed out (up to `limit`, as `fit_to_source` takes)."""

    def __init__(self, batches: Iterable[pa.Table], limit: int) -> None:
        self.batches, self.limit, self.rows = batches, limit, 0

    def __iter__(self) -> Iterator[pa.Table]:
        for batch in self.batches:
            self.rows = min(self.limit, self.rows + batch.num_rows)
            yield batch
