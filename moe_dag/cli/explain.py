"""`moe-dag explain DOC_ID`: one document's way through the pipeline (moe_dag/operations/lineage.py),
with the config key and value behind each drop, as text for people or JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import numpy as np

from moe_dag.config import PipelineConfig, load_config
from moe_dag.operations.lineage import step_ranges, trace_document
from moe_dag.storage.catalog import Catalog, CatalogError
from moe_dag.storage.lake import Lake


def explain(config_path: str, document_id: str, output: str = "text", out: TextIO | None = None) -> int:
    """Print the document's trace (on `out`, else stdout); 1 when no stage saw the id, 2 when the catalog
    cannot be read."""
    config = load_config(config_path)
    try:
        trace = trace_document(Catalog(config.catalog_path, Lake(config.lake_root)), document_id)
    except CatalogError as error:
        print(f"moe-dag explain: {error}", file=sys.stderr)
        return 2
    if trace is None:
        print(
            f"moe-dag explain: document {document_id!r} not found: no raw document and no quarantined line "
            f"has that id in the catalog {config.catalog_path}",
            file=sys.stderr,
        )
        return 1
    with_settings(trace, config)
    text = json.dumps(trace, indent=2, default=str) + "\n" if output == "json" else format_trace(trace)
    (out or sys.stdout).write(text)
    return 0


def with_settings(trace: dict[str, Any], config: PipelineConfig) -> None:
    """Add to each drop the config key and value that decided it, where one governs the reason."""
    for document in trace["documents"]:
        for stage in document["stages"]:
            if stage["keep"] is False and document["source"] in config.source_names:
                setting = config.reason_settings(stage["stage"], document["source"]).get(stage["reason"])
                stage["setting"] = str(setting) if setting is not None else None


def format_trace(trace: dict[str, Any]) -> str:
    lines = [f"document {trace['id']}"]
    for quarantined in trace["quarantined"]:
        lines.append(
            f"  quarantined: {quarantined['shard']} line {quarantined['line']} "
            f"[{quarantined['source']}]: {quarantined['error']}"
        )
    for document in trace["documents"]:
        lines += _document_lines(document)
    return "\n".join(lines) + "\n"


def _document_lines(document: dict[str, Any]) -> list[str]:
    lines = [f"  source {document['source']}: {document['shard']} line {document['line']}"]
    for stage in document["stages"]:
        if stage["keep"] is None:
            decision = "not reached"
        elif stage["keep"]:
            decision = "kept"
        else:
            setting = f" ({stage['setting']})" if stage.get("setting") else ""
            decision = f"dropped: {stage['reason']}{setting}"
        lines.append(f"  {stage['stage']:<18} {decision}")
    dedup = document["dedup"]
    if dedup is not None:
        survivor = dedup["survivor"]
        named = f"{survivor['id']} [{survivor['source']}]" if survivor else "none"
        lines.append(f"  dedup cluster      {dedup['cluster_id']}, survivor {named}")
    if document["oracle_label"] is not None:
        label = document["oracle_label"]
        lines.append(f"  oracle label       {label['quality']} ({label['rubric']} rubric, {label['model']})")
    if document["head_scores"] is not None:
        scores = document["head_scores"]
        judge = "not run (probe exit)" if scores["judge_score"] is None else f"{scores['judge_score']:.4f}"
        lines.append(f"  head scores        probe {scores['probe_score']:.4f}, judge {judge}")
    sets = ", ".join(document["evaluation_sets"]) or "none"
    lines.append(f"  evaluation sets    {sets}")
    for mixture in document["mixtures"]:
        sequences = np.unique([piece["sequence"] for piece in mixture["sequences"]])
        carried = (
            f"sequences {_ranges_of_pairs(step_ranges(sequences))}" if len(sequences) else "in no sequence"
        )
        lines.append(f"  {mixture['mixture']:<18} {carried}")
        for run in mixture["runs"]:
            steps = _ranges_of_pairs(run["step_ranges"]) or "none"
            loss = run["heldout_nll_nats"]
            held = "" if loss is None else f"; held-out loss {loss:.2f} nats over the document"
            lines.append(f"    run {run['run']}: read at steps {steps} of {run['steps']}{held}")
    return lines


def _ranges_of_pairs(pairs: list[list[int]]) -> str:
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in pairs)
