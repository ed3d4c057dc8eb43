"""Arrow schemas shared by every stage of the pipeline.

A document row keeps the Dolma fields (`id`, `text`, `source`, `added`, `created`, `metadata`) plus
where it came from (`shard`, `line`), so any kept or dropped row can be traced back to its file.
`metadata` stays a JSON string: Dolma metadata differs per source and a fixed struct would drop fields.

Stages never delete rows. A filtering stage writes every row it was given, adding `keep` and `reason`
(null when kept) plus its own score columns; the next stage reads the rows where `keep` is true.
"""

from __future__ import annotations

from typing import Literal, get_args

import pyarrow as pa
import pyarrow.compute as pc

# What a source holds. The kind chooses the rules a stage applies (code rules and the code rubric for
# "code"; prose rules and the general rubric for every other kind, with the prefilter's changes for that
# kind of text: short social posts are not judged as web pages), so it is a fixed set, checked when the
# config loads: a misspelt kind must not silently become "text".
SourceKind = Literal["code", "web", "reference", "books", "forum", "social", "math", "science"]
SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("added", pa.string()),
        pa.field("created", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("line", pa.int64(), nullable=False),
    ]
)

DECISION_FIELDS = [pa.field("keep", pa.bool_(), nullable=False), pa.field("reason", pa.string())]

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("line", pa.int64(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
        pa.field("raw", pa.string()),
    ]
)


def with_decisions(table: pa.Table, keep: list[bool], reason: list[str | None]) -> pa.Table:
    """Return `table` with its `keep` and `reason` columns set (replacing earlier ones)."""
    for name in ("keep", "reason"):
        if name in table.column_names:
            table = table.drop_columns(name)
    table = table.append_column(DECISION_FIELDS[0], pa.array(keep, pa.bool_()))
    return table.append_column(DECISION_FIELDS[1], pa.array(reason, pa.string()))


def kept_rows(table: pa.Table) -> pa.Table:
    """The rows a stage passed on, without its decision columns."""
    kept = table.filter(table["keep"])
    return kept.drop_columns([c for c in ("keep", "reason") if c in kept.column_names])


def reason_counts(table: pa.Table) -> dict[str, int]:
    """Dropped rows per reason code, most frequent first."""
    dropped = table.filter(pc.invert(table["keep"]))
    counts = pc.value_counts(dropped["reason"]).to_pylist()
    pairs = [(c["values"] or "unknown", c["counts"]) for c in counts]
    return dict(sorted(pairs, key=lambda kv: (-kv[1], kv[0])))


# Reason codes the catalog's views read: dedup's two (a copy found by exact hash or by MinHash) and
# language ID's "identified, but not a language the source keeps" (not a loss of that language: the
# source never wanted it).
DUPLICATE_REASONS = ("exact_duplicate", "near_duplicate")
LANGUAGE_NOT_ACCEPTED = "language_not_allowed"
