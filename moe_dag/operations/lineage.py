"""One document's way through the pipeline, from the catalog and the run folders: what `moe-dag explain`
prints.

A trace is a plain dict (JSON as it stands), built from what the graph left behind and nothing recomputed
but the step ranges: the raw line (or the quarantined line that names the id), each filter stage's
decision and reason, the dedup cluster and its survivor, the oracle's label and the heads' scores,
evaluation-set membership, the packed sequences of each mixture that carry the document's tokens
(`<mixture>_sequences` views), the optimizer steps of each training run that read those sequences (the
trainer's data order, `steps_reading_rows`), and the per-document held-out loss of each run that scored
it. The config keys behind each reason come from the caller (the config sits above this floor).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq

from moe_dag.storage.catalog import DECISION_STAGES, MIXTURE_SEQUENCE_STAGES, Catalog, view_name
from moe_dag.training.data import steps_reading_rows
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE

# The quarantine keeps a line that could not be read as a document; the id, where the line names one.
QUARANTINED_ID = r'"id"\s*:\s*"((?:[^"\\]|\\.)*)"'
# The training assets' lake folders of run folders (the proxy, and the comparisons' dense model and
# unfiltered proxy); a run belongs to the mixture its summary's data_dir names.
RUN_FOLDERS = ("moe_proxy", "moe_gain", "curation_gain")
SCORE_COLUMNS = ("probe_score", "judge_score", "heads_version")


def trace_document(catalog: Catalog, document_id: str) -> dict[str, Any] | None:
    """Everything the catalog and the run folders know of `document_id`; None when no stage saw it."""
    with catalog.reader() as con:
        views = {row[0] for row in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        quarantined = _quarantined(con, views, document_id)
        documents = _rows(
            con,
            views,
            "raw_documents",
            "SELECT source, shard, line FROM raw_documents WHERE id = ?",
            document_id,
        )
        if not documents and not quarantined:
            return None
        traced = [_document(con, views, catalog, document_id, found) for found in documents]
    return {"id": document_id, "documents": traced, "quarantined": quarantined}


def _document(
    con: duckdb.DuckDBPyConnection, views: set[str], catalog: Catalog, document_id: str, found: dict
) -> dict[str, Any]:
    source = found["source"]
    key = (source, document_id)
    stages = []
    for stage in DECISION_STAGES:
        rows = _rows(con, views, stage, f"SELECT keep, reason FROM {stage} WHERE source = ? AND id = ?", *key)
        stages.append({"stage": stage, **(rows[0] if rows else {"keep": None, "reason": "not reached"})})
    dedup = _rows(
        con,
        views,
        "dedup_clusters",
        "SELECT cluster_id, is_survivor, duplicate_of, match, jaccard FROM dedup_clusters "
        "WHERE source = ? AND id = ?",
        *key,
    )
    survivor = []
    if dedup:
        survivor = _rows(
            con,
            views,
            "dedup_clusters",
            "SELECT source, id FROM dedup_clusters WHERE cluster_id = ? AND is_survivor",
            dedup[0]["cluster_id"],
        )
    label = _rows(
        con,
        views,
        "oracle_labels",
        "SELECT rubric, quality, model, prompt_version FROM oracle_labels WHERE source = ? AND id = ?",
        *key,
    )
    scores = _rows(
        con,
        views,
        "scored_documents",
        f"SELECT {', '.join(SCORE_COLUMNS)} FROM scored_documents WHERE source = ? AND id = ?",
        *key,
    )
    sets = _rows(
        con,
        views,
        "evaluation_documents",
        "SELECT DISTINCT eval_set FROM evaluation_documents WHERE source = ? AND id = ? ORDER BY eval_set",
        *key,
    )
    mixtures = [_mixture(con, views, catalog, stage, *key) for stage in MIXTURE_SEQUENCE_STAGES]
    return {
        **found,
        "stages": stages,
        "dedup": {**dedup[0], "survivor": survivor[0] if survivor else None} if dedup else None,
        "oracle_label": label[0] if label else None,
        "head_scores": scores[0] if scores and scores[0]["probe_score"] is not None else None,
        "evaluation_sets": [row["eval_set"] for row in sets],
        "mixtures": [mixture for mixture in mixtures if mixture is not None],
    }


def _mixture(
    con: duckdb.DuckDBPyConnection,
    views: set[str],
    catalog: Catalog,
    stage: str,
    source: str,
    document_id: str,
) -> dict[str, Any] | None:
    """The sequences of one mixture that carry the document, the runs that read them, and its held-out
    loss in each run that scored it; None when the mixture was never built."""
    view = view_name(stage)
    if view not in views:
        return None
    pieces = _rows(
        con,
        views,
        view,
        f"SELECT sequence, position, token_start, token_end FROM {view} "
        "WHERE source = ? AND document_id = ? ORDER BY sequence, position",
        source,
        document_id,
    )
    mixture = stage.split("/")[0]
    runs = []
    for run_dir in _run_dirs(catalog, mixture):
        summary = json.loads((run_dir / "summary.json").read_text())
        train = summary["config"]["train"]
        mixture_report = json.loads((Path(summary["data_dir"]) / "mixture.json").read_text())
        steps = steps_reading_rows(
            np.array(sorted({piece["sequence"] for piece in pieces}), dtype=np.int64),
            num_sequences=mixture_report["num_sequences"],
            lanes=train["batch_size"] * summary["world_size"],
            grad_accum_steps=train["grad_accum_steps"],
            steps=summary["steps"],
        )
        loss = _heldout_loss(run_dir, source, document_id)
        if len(steps) or loss is not None:  # runs that neither read it nor scored it say nothing of it
            runs.append(
                {
                    "run": str(run_dir),
                    "steps": summary["steps"],
                    "step_ranges": step_ranges(steps),
                    "heldout_nll_nats": loss,
                }
            )
    return {"mixture": mixture, "sequences": pieces, "runs": runs}


def _run_dirs(catalog: Catalog, mixture: str) -> list[Path]:
    """The finished run folders (those with a summary) that trained on `mixture`, on a local lake."""
    if not catalog.lake.is_local:
        return []
    data_dir = (Path(catalog.lake.root) / mixture).resolve()
    summaries = (
        path for folder in RUN_FOLDERS for path in (Path(catalog.lake.root) / folder).rglob("summary.json")
    )
    return sorted(
        path.parent
        for path in summaries
        if Path(json.loads(path.read_text()).get("data_dir", "")).resolve() == data_dir
    )


def _heldout_loss(run_dir: Path, source: str, document_id: str) -> float | None:
    path = run_dir / EVAL_DOCUMENTS_FILE
    if not path.exists():
        return None
    table = pq.read_table(path, filters=[("source", "=", source), ("id", "=", document_id)])
    return table["nll_nats"][0].as_py() if table.num_rows else None


def step_ranges(steps: np.ndarray) -> list[list[int]]:
    """Sorted unique numbers (steps, sequences) as [first, last] runs of consecutive ones:
    [1, 2, 3, 7] -> [[1, 3], [7, 7]]."""
    if not len(steps):
        return []
    breaks = np.flatnonzero(np.diff(steps) != 1)
    firsts = np.concatenate([[steps[0]], steps[breaks + 1]])
    lasts = np.concatenate([steps[breaks], [steps[-1]]])
    return [[int(first), int(last)] for first, last in zip(firsts, lasts, strict=True)]


def _quarantined(con: duckdb.DuckDBPyConnection, views: set[str], document_id: str) -> list[dict]:
    return _rows(
        con,
        views,
        "quarantine",
        # The line's id as written, or as ingest would have made it (prefixed with the source).
        "SELECT source, shard, line, error FROM quarantine "
        "WHERE ? IN (regexp_extract(raw, $2, 1), source || '/' || regexp_extract(raw, $2, 1)) "
        "ORDER BY source, shard, line",
        re.sub(r'(["\\])', r"\\\1", document_id),
        QUARANTINED_ID,
    )


def _rows(con: duckdb.DuckDBPyConnection, views: set[str], view: str, sql: str, *params: Any) -> list[dict]:
    """The query's rows as dicts, or none when the view is not in the catalog (the stage never ran)."""
    if view not in views:
        return []
    cursor = con.execute(sql, list(params))
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
