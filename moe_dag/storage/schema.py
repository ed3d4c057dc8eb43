"""Arrow schemas shared by every stage of the pipeline.

A document row keeps the Dolma fields (`id`, `text`, `source`, `added`, `created`, `metadata`) plus
where it came from (`shard`, `line`), so any kept or dropped row can be traced back to its file.
`metadata` stays a JSON string: Dolma metadata differs per source and a fixed struct would drop fields.

Stages never delete rows. A filtering stage writes every row it was given, adding `keep` and `reason`
(null when kept) plus its own score columns; the next stage reads the rows where `keep` is true.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

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


# Field metadata of a column whose values almost never repeat (ids, content hashes, MinHash signatures):
# parquet writers store it without a dictionary, which for such a column grows to its size limit and is
# then dropped (minhash signatures took 3.5 times as long to write with one, in larger files).
NO_DICTIONARY = {b"parquet.dictionary": b"false"}


def parquet_write_options(schema: pa.Schema) -> dict[str, Any]:
    """What every stage writes parquet with: zstd, and a dictionary for every column not marked
    `NO_DICTIONARY` (parquet names a nested column's values by their leaf paths)."""
    dictionary = [
        path
        for field in schema
        if (field.metadata or {}).get(b"parquet.dictionary") != b"false"
        for path in _leaf_paths(field.name, field.type)
    ]
    return {"compression": "zstd", "use_dictionary": dictionary}


def _leaf_paths(name: str, kind: pa.DataType) -> list[str]:
    if pa.types.is_struct(kind):
        return [p for child in kind for p in _leaf_paths(f"{name}.{child.name}", child.type)]
    if pa.types.is_map(kind):
        return _leaf_paths(f"{name}.key_value.key", kind.key_type) + _leaf_paths(
            f"{name}.key_value.value", kind.item_type
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_paths(f"{name}.list.element", kind.value_type)
    return [name]


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
