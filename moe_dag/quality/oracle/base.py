"""What every oracle takes and returns, and the Arrow tables labels and failures are stored as.

An oracle turns label requests into rubric scores. Production oracles are LLMs behind vLLM, the CPU
default is a rule-based scorer; all of them yield one `LabelResult` per request, as results arrive:
a label, or the error and raw replies of a document that could not be labelled. A failed document
never stops the others; only a fault that would fail every request (a wrong key, URL or model name)
raises `OracleError`. So the heads and the catalog never know which oracle labelled a document.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from moe_dag.quality.oracle.rubrics import PROMPT_VERSION, RUBRICS, rubric_by_name, rubric_for_kind


class OracleError(RuntimeError):
    """The oracle cannot label anything (misconfigured or unreachable): the run must stop."""


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


@dataclass(frozen=True)
class LabelResult:
    """What became of one request: `label`, or `error` with the raw replies of the failed attempts."""

    request: LabelRequest
    label: OracleLabel | None = None
    error: str | None = None
    replies: tuple[str, ...] = ()
    attempts: int = 1


class Oracle(Protocol):
    model_name: str

    def label(self, requests: Sequence[LabelRequest]) -> Iterator[LabelResult]:
        """One result per request, in any order, yielded as soon as each is known."""
        ...


def sampling_for_attempt(temperature: float, retry_temperature: float, seed: int, attempt: int) -> dict:
    """Temperature and seed of attempt `attempt` (0 first): a retry never repeats an earlier request.

    The first attempt samples at the configured temperature; retries sample at least at
    `retry_temperature`, each with its own seed, so a reply that failed at temperature 0 can change.
    """
    return {
        "temperature": temperature if attempt == 0 else max(temperature, retry_temperature),
        "seed": seed + attempt,
    }


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


def requests_from_table(table: pa.Table, source_kinds: Mapping[str, str]) -> list[LabelRequest]:
    """One request per document row, with the rubric chosen by the kind of the row's source."""
    unknown = sorted(set(table["source"].to_pylist()) - set(source_kinds))
    if unknown:
        raise ValueError(f"no kind known for source {unknown[0]!r}; known sources: {sorted(source_kinds)}")
    rubrics = {source: rubric_for_kind(kind).name for source, kind in source_kinds.items()}
    return [
        LabelRequest(id=i, text=t, source=s, rubric=rubrics[s])
        for i, t, s in zip(
            table["id"].to_pylist(), table["text"].to_pylist(), table["source"].to_pylist(), strict=True
        )
    ]


# Every dimension of every rubric gets its own nullable column (null where the row's rubric lacks it), so
# DuckDB can aggregate a dimension without parsing JSON; `scores` stays the authoritative copy.
DIMENSIONS = sorted({dim for rubric in RUBRICS.values() for dim in rubric.dimensions})

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
    + [pa.field(f"score_{dim}", pa.int8()) for dim in DIMENSIONS]
)
_LABEL_FIELDS = LABEL_SCHEMA.names[:7]

FAILURE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("rubric", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
        pa.field("replies", pa.list_(pa.string()), nullable=False),
    ]
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
    for dim in DIMENSIONS:
        columns[f"score_{dim}"] = [label.scores.get(dim) for label in labels]
    return pa.Table.from_pydict(columns, schema=LABEL_SCHEMA)


def failures_to_table(failures: Sequence[LabelResult], model: str) -> pa.Table:
    rows = [
        {
            "id": f.request.id,
            "source": f.request.source,
            "rubric": f.request.rubric,
            "model": model,
            "prompt_version": PROMPT_VERSION,
            "attempts": f.attempts,
            "error": f.error or "unknown error",
            "replies": list(f.replies),
        }
        for f in failures
    ]
    return pa.Table.from_pylist(rows, schema=FAILURE_SCHEMA)


def table_to_labels(table: pa.Table) -> list[OracleLabel]:
    """Labels back from a label table; the scores are re-validated against their rubric."""
    missing = [name for name in _LABEL_FIELDS if name not in table.column_names]
    if missing:
        raise ValueError(f"label table lacks column {missing[0]!r}")
    labels = []
    for row in table.select(_LABEL_FIELDS).to_pylist():
        request = LabelRequest(id=row["id"], text="", source=row["source"], rubric=row["rubric"])
        labels.append(make_label(request, json.loads(row["scores"]), row["model"], row["prompt_version"]))
    return labels
