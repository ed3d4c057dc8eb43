"""The short report `make demo` ends with, read back from the DuckDB catalog and the lake."""

from __future__ import annotations

import json
from pathlib import Path

from moe_dag.config import PipelineConfig
from moe_dag.data.catalog import Catalog
from moe_dag.data.lake import Lake

FUNNEL_STAGES = ["raw_documents", "prefiltered", "deduplicated", "toxicity_filtered", "scored_documents"]


def format_summary(config: PipelineConfig) -> str:
    lake = Lake(config.lake_root)
    catalog = Catalog(config.catalog_path, lake)
    lines = ["", "== moe-dag summary =="]
    lines += _funnel(catalog, config.source_names)
    lines += _dedup(catalog)
    lines += _heads(Path(lake.root) / "quality_heads")
    lines += _mixture(Path(lake.root) / "tokenized_mixture" / "mixture.json")
    lines += _evaluation(catalog)
    lines.append(f"catalog: {catalog.path}  (duckdb {catalog.path} -c 'SELECT * FROM stage_funnel')")
    return "\n".join(lines)


def _funnel(catalog: Catalog, sources: list[str]) -> list[str]:
    kept = {
        (stage, source): (rows_in, kept)
        for stage, source, rows_in, kept, _ in catalog.query("SELECT * FROM stage_funnel")
    }
    quarantined = dict(catalog.query("SELECT source, count(*) FROM quarantine GROUP BY source"))
    width = max(len(s) for s in FUNNEL_STAGES)
    header = f"{'documents kept per stage':<{width}}  " + "  ".join(f"{s:>8}" for s in sources)
    lines = [header]
    lines.append(
        f"{'lines in shards':<{width}}  "
        + "  ".join(f"{kept[('raw_documents', s)][0] + quarantined.get(s, 0):>8}" for s in sources)
    )
    lines.append(f"{'quarantined':<{width}}  " + "  ".join(f"{quarantined.get(s, 0):>8}" for s in sources))
    for stage in FUNNEL_STAGES:
        lines.append(f"{stage:<{width}}  " + "  ".join(f"{kept[(stage, s)][1]:>8}" for s in sources))
    return lines


def _dedup(catalog: Catalog) -> list[str]:
    rows = catalog.query(
        "SELECT reason, count(*) FROM deduplicated WHERE NOT keep GROUP BY reason ORDER BY reason"
    )
    total = sum(count for _, count in rows)
    detail = ", ".join(f"{count} {reason}" for reason, count in rows)
    return [f"duplicates removed: {total} ({detail or 'none'})"]


def _heads(folder: Path) -> list[str]:
    meta = json.loads((folder / "heads.json").read_text())
    metrics = meta["metrics"]
    figures = ", ".join(f"{name} {value:.3f}" for name, value in sorted(metrics.items()))
    return [f"oracle-to-head agreement on held-out labels (heads {meta['version']}): {figures}"]


def _mixture(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    shares = ", ".join(
        f"{name} {figures['achieved_share']:.3f} (target {figures['target_share']:.3f})"
        for name, figures in sorted(report["sources"].items())
    )
    return [f"mixture: {report['num_sequences']} sequences of {report['seq_len']} tokens; shares {shares}"]


def _evaluation(catalog: Catalog) -> list[str]:
    rows = catalog.query("SELECT source, loss, bits_per_byte FROM proxy_eval ORDER BY source")
    per_source = ", ".join(
        f"{source} loss {loss:.3f} / {bpb:.3f} bits per byte" for source, loss, bpb in rows
    )
    return [f"proxy held-out evaluation: {per_source}"]
