"""What every oracle takes and returns, and the Arrow table its labels are stored as.

An oracle turns label requests into rubric scores. Production oracles are LLMs behind vLLM, the CPU
default is a rule-based scorer; all of them return `OracleLabel`s with the same fields, so the heads and
the catalog never know which one labelled a document.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from moe_dag.data.oracle.rubrics import PROMPT_VERSION, RUBRICS, rubric_by_name, rubric_for_kind


class OracleError(RuntimeError):
    """A document could not be labelled."""


@dataclass(frozen=True)
class LabelRequest:
    id: str
    text: str
    source: str
    rubric: str


@dataclass(frozen=True)
class OracleLabel:
    id: str
    source: str
    rubric: str
    scores: dict[str, int]
    quality: float
    model: str
    prompt_version: str


class Oracle(Protocol):
    model_name: str

    def label(self, requests: Sequence[LabelRequest]) -> list[OracleLabel]: ...


def make_label(
    request: LabelRequest, scores: Mapping[str, object], model: str, prompt_version: str = PROMPT_VERSION
) -> OracleLabel:
    """Validate `scores` against the request's rubric and build its label (ValueError names the id)."""
    rubric = rubric_by_name(request.rubric)
    try:
        checked = rubric.validate(scores)
    except ValueError as err:
        raise ValueError(f"document {request.id!r}: {err}") from err
    return OracleLabel(
        id=request.id,
        source=request.source,
        rubric=rubric.name,
        scores=checked,
        quality=rubric.quality(checked),
        model=model,
        prompt_version=prompt_version,
    )


def requests_from_table(table: pa.Table) -> list[LabelRequest]:
    """One request per document row, with the rubric chosen by the row's source ("code" or general)."""
    return [
        LabelRequest(id=i, text=t, source=s, rubric=rubric_for_kind(s).name)
        for i, t, s in zip(
            table["id"].to_pylist(), table["text"].to_pylist(), table["source"].to_pylist(), strict=True
        )
    ]


# Every dimension of every rubric gets its own nullable column (null where the row's rubric lacks it), so
# DuckDB can aggregate a dimension without parsing JSON; `scores` stays the authoritative copy.
_DIMENSIONS = sorted({dim for rubric in RUBRICS.values() for dim in rubric.dimensions})

LABEL_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("rubric", pa.string(), nullable=False),
        pa.field("scores", pa.string(), nullable=False),
        pa.field("quality", pa.float64(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
    ]
    + [pa.field(f"score_{dim}", pa.int8()) for dim in _DIMENSIONS]
)


def labels_to_table(labels: Sequence[OracleLabel]) -> pa.Table:
    columns: dict[str, list] = {
        "id": [label.id for label in labels],
        "source": [label.source for label in labels],
        "rubric": [label.rubric for label in labels],
        "scores": [json.dumps(label.scores, sort_keys=True) for label in labels],
        "quality": [label.quality for label in labels],
        "model": [label.model for label in labels],
        "prompt_version": [label.prompt_version for label in labels],
    }
    for dim in _DIMENSIONS:
        columns[f"score_{dim}"] = [label.scores.get(dim) for label in labels]
    return pa.Table.from_pydict(columns, schema=LABEL_SCHEMA)


def table_to_labels(table: pa.Table) -> list[OracleLabel]:
    """Labels back from a label table; the scores are re-validated against their rubric."""
    missing = [name for name in LABEL_SCHEMA.names[:7] if name not in table.column_names]
    if missing:
        raise ValueError(f"label table lacks column {missing[0]!r}")
    labels = []
    for row in table.select(LABEL_SCHEMA.names[:7]).to_pylist():
        request = LabelRequest(id=row["id"], text="", source=row["source"], rubric=row["rubric"])
        labels.append(make_label(request, json.loads(row["scores"]), row["model"], row["prompt_version"]))
    return labels
