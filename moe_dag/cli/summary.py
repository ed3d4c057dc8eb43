"""The short report `make demo` ends with, read back from the DuckDB catalog and the lake."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from moe_dag.config import PipelineConfig
from moe_dag.engine import merge_counts
from moe_dag.operations.bounds import (
    calibration_shortfalls,
    epoch_cap_shortfalls,
    keep_rate_violation,
    share_error_violations,
)
from moe_dag.storage.catalog import FUNNEL_STAGES, Catalog, CatalogError
from moe_dag.storage.lake import Lake


def format_summary(config: PipelineConfig) -> str:
    """The report, section by section; a section whose inputs do not exist yet says so in one line, so
    the summary of a partial run shows what exists instead of stopping at what does not."""
    lake = Lake(config.lake_root)
    catalog = Catalog(config.catalog_path, lake)
    lines = ["", "== moe-dag summary =="]
    lines += _section(
        "documents per stage", "document_catalog", lambda: _funnel(catalog, config.source_names)
    )
    declared = {source.name: source.languages for source in config.sources}
    lines += _section("kept share per language", "document_catalog", lambda: _languages(catalog, declared))
    lines += _section("duplicates", "deduplicated, document_catalog", lambda: _dedup(catalog))
    lines += _section(
        "injected noise", "toxicity_filtered, document_catalog", lambda: _injected_noise(catalog)
    )
    lines += _section(
        "quality heads",
        "quality_heads, scored_documents",
        lambda: _heads(lake.artifact_dir("quality_heads"), catalog),
    )
    lines += _section(
        "mixture",
        "tokenized_mixture",
        lambda: _mixture(lake.artifact_dir("tokenized_mixture") / "mixture.json"),
    )
    lines += _section(
        "proxy evaluation", "proxy_eval", lambda: _evaluation(catalog, lake.artifact_dir("moe_proxy"))
    )
    lines += _section("comparisons", "curation_gain, moe_gain", lambda: _comparisons(lake))
    lines += old_decisions(config, lake)
    lines += warning_findings(config, lake, catalog)
    lines.append(f"catalog: {catalog.path}  (try: .venv/bin/moe-dag query 'SELECT * FROM stage_funnel')")
    return "\n".join(lines)


def _section(title: str, assets: str, build: Callable[[], list[str]]) -> list[str]:
    try:
        return build()
    except (FileNotFoundError, CatalogError) as missing:
        return [f"{title}: not materialised yet (needs {assets}): {missing}"]


def _funnel(catalog: Catalog, sources: list[str]) -> list[str]:
    kept = {
        (stage, source): (rows_in, kept)
        for stage, source, rows_in, kept, _ in catalog.query("SELECT * FROM stage_funnel")
    }
    quarantined = dict(catalog.query("SELECT source, count(*) FROM quarantine GROUP BY source"))
    title = "documents kept per stage"
    width = len(title)
    header = f"{title:<{width}}  " + "  ".join(f"{s:>8}" for s in sources)
    lines = [header]
    lines.append(
        f"{'lines in shards':<{width}}  "
        + "  ".join(
            f"{kept.get(('raw_documents', s), (0, 0))[0] + quarantined.get(s, 0):>8}" for s in sources
        )
    )
    lines.append(f"{'quarantined':<{width}}  " + "  ".join(f"{quarantined.get(s, 0):>8}" for s in sources))
    for stage in FUNNEL_STAGES:
        counts = (kept.get((stage, s), (0, 0))[1] for s in sources)
        lines.append(f"{stage:<{width}}  " + "  ".join(f"{count:>8}" for count in counts))
    for source in sources:
        reached = [stage for stage in FUNNEL_STAGES if (stage, source) in kept]
        if reached and kept[(reached[-1], source)][1] == 0:
            lines.append(
                f"source {source!r} lost every document at {reached[-1]}: "
                f'moe-dag query "SELECT reason, count(*) FROM {reached[-1]} '
                f"WHERE source = '{source}' GROUP BY ALL\""
            )
    return lines


LANGUAGE_GAP = 0.15  # a language kept this much above or below its source's share is marked


def _languages(catalog: Catalog, declared: dict[str, list[str] | None]) -> list[str]:
    """Per source with more than one language: its kept share, then each language's, lowest first; a
    language far from its source's share is marked, one that kept nothing is named. In a source declared
    in one language, documents language ID placed in another are its mistakes, not languages: counted
    as disagreements."""
    rows = catalog.query("SELECT source, language, documents, kept FROM language_funnel ORDER BY ALL")
    lines = []
    for source in sorted({row[0] for row in rows}):
        mine = [(language, n, k) for src, language, n, k in rows if src == source and language != "und"]
        only = declared.get(source) or []
        if len(only) == 1:
            lines += _disagreements(source, only[0], [row for row in mine if row[0] != only[0]])
            mine = [row for row in mine if row[0] == only[0]]
        if len(mine) < 2:
            continue
        documents, kept = sum(n for _, n, _ in mine), sum(k for _, _, k in mine)
        share = kept / documents
        lines.append(
            f"kept share per language in {source!r}: {share:.2f} over {len(mine)} languages "
            f"(* more than {LANGUAGE_GAP} away)"
        )
        ranked = sorted(mine, key=lambda row: (row[2] / row[1], row[0]))
        cells = [
            f"{language} {k / n:.2f}{'*' if abs(k / n - share) > LANGUAGE_GAP else ''} ({k}/{n})"
            for language, n, k in ranked
        ]
        lines += ["  " + "  ".join(cells[i : i + 6]) for i in range(0, len(cells), 6)]
        lost = [language for language, n, k in ranked if k == 0]
        if lost:
            lines.append(
                f"  lost every document: {', '.join(lost)} (* = more than {LANGUAGE_GAP} from {share:.2f})"
            )
    return lines


def _disagreements(source: str, language: str, others: list[tuple[str, int, int]]) -> list[str]:
    """One line for the documents of a one-language source that language ID named another language."""
    if not others:
        return []
    ranked = sorted(others, key=lambda row: (-row[1], row[0]))
    cells = ", ".join(f"{other} {n}" for other, n, _ in ranked)
    documents, kept = sum(n for _, n, _ in others), sum(k for _, _, k in others)
    return [
        f"language ID disagreements in {source!r} (declared {language}): {documents} documents named another "
        f"language ({cells}), {kept} of them kept"
    ]


def _dedup(catalog: Catalog) -> list[str]:
    rows = catalog.query(
        "SELECT reason, count(*) FROM deduplicated WHERE NOT keep GROUP BY reason ORDER BY reason"
    )
    total = sum(count for _, count in rows)
    detail = ", ".join(f"{count} {reason}" for reason, count in rows)
    return [f"duplicates removed: {total} ({detail or 'none'})"]


# A duplicate counts as caught when it and its original did not both survive: dedup keeps whichever of
# the two the survivor rule prefers, not necessarily the original. `duplicate_of` holds the original's id
# as written in its shard, before ingest namespaced it by source.
NOISE_SQL = """
WITH fate AS (
    SELECT r.id, substr(r.id, length(r.source) + 2) AS shard_id,
           json_extract_string(r.metadata, '$.demo_noise') AS noise,
           json_extract_string(r.metadata, '$.duplicate_of') AS duplicate_of,
           coalesce(t.keep, false) AS survived
    FROM raw_documents r LEFT JOIN toxicity_filtered t USING (source, id)
)
SELECT f.noise, count(*) AS injected,
       count(*) FILTER (WHERE NOT (f.survived AND (f.duplicate_of IS NULL OR coalesce(o.survived, false))))
FROM fate f LEFT JOIN fate o ON o.shard_id = f.duplicate_of
WHERE f.noise IS NOT NULL GROUP BY f.noise ORDER BY f.noise
"""


def _injected_noise(catalog: Catalog) -> list[str]:
    """For the demo corpus, whose documents record the noise injected into them: how much was caught."""
    rows = catalog.query(NOISE_SQL)
    if not rows:
        return []
    caught = ", ".join(f"{noise} {removed}/{injected}" for noise, injected, removed in rows)
    return [f"injected noise caught before quality scoring: {caught}"]


def _heads(folder: Path, catalog: Catalog) -> list[str]:
    meta = json.loads((folder / "heads.json").read_text())
    m = meta["metrics"]

    def agreement(head: str) -> str:
        return (
            f"  {head} Pearson {m[f'{head}_pearson']:.3f}, Spearman {m[f'{head}_spearman']:.3f}, "
            f"MAE {m[f'{head}_mae']:.3f}"
        )

    dropped, passed, scored = catalog.query(
        "SELECT count(*) FILTER (WHERE reason = 'probe_below_tau_drop'), "
        "count(*) FILTER (WHERE keep AND judge_score IS NULL), count(*) FROM scored_documents"
    )[0]
    return [
        f"oracle-to-head agreement on {m['n_heldout']:.0f} held-out labels (heads {meta['version']}):",
        agreement("probe"),
        agreement("judge"),
        f"  keep-decision F1 vs the oracle at each source's keep rate: judge {m['judge_f1']:.3f}, "
        f"probe {m['probe_f1']:.3f}",
        f"  early exit at the probe: {dropped + passed} of {scored} scored documents ({dropped} dropped, "
        f"{passed} kept)",
    ]


def _mixture(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    shares = ", ".join(
        f"{name} {figures['achieved_share']:.3f} (target {figures['target_share']:.3f})"
        for name, figures in sorted(report["sources"].items())
    )
    return [f"mixture: {report['num_sequences']} sequences of {report['seq_len']} tokens; shares {shares}"]


def _evaluation(catalog: Catalog, runs: Path) -> list[str]:
    report = json.loads((runs / (runs / "latest").read_text().strip() / "eval.json").read_text())
    overall = report["overall"]
    low, high = overall["bits_per_byte_ci"]
    rows = catalog.query("SELECT source, loss, bits_per_byte, documents FROM proxy_eval ORDER BY source")
    per_source = ", ".join(
        f"{source} loss {loss:.3f} / {bpb:.3f} bits per byte ({documents} documents)"
        for source, loss, bpb, documents in rows
    )
    return [
        f"proxy validation loss {overall['loss']:.3f} nats/token, "
        f"{overall['bits_per_byte']:.3f} bits per byte (95% interval {low:.3f}-{high:.3f} "
        f"over {overall['documents']} documents, step {report['step']})",
        f"  per source: {per_source}",
    ]


def old_decisions(config: PipelineConfig, lake: Lake) -> list[str]:
    """How many scoring decisions made before were changed when their shard was last scored again, per
    source and by why (new heads, or new thresholds), from scored_documents' completion records
    (`moe_dag.quality.scoring.decision_changes`). Nothing before scored_documents ran."""
    per_source = {
        source: merge_counts(
            [record["counts"] for record in lake.records("scored_documents", source).values()]
        )
        for source in config.source_names
    }
    if not any(per_source.values()):
        return []
    again = {source: counts.get("decided_again", {}) for source, counts in per_source.items()}
    changed = {source: counts.get("decisions_changed", {}) for source, counts in per_source.items()}
    if not any(again.values()):
        return [
            "old scoring decisions changed: none "
            "(every scored document was decided once, by the current heads)"
        ]
    again_by_why, changed_by_why = merge_counts(list(again.values())), merge_counts(list(changed.values()))
    sources = ", ".join(
        f"{source} {sum(changed[source].values())} of {sum(again[source].values())}"
        for source in config.source_names
        if again[source]
    )
    whys = ", ".join(f"{why} {changed_by_why.get(why, 0)} of {count}" for why, count in again_by_why.items())
    return [
        f"old scoring decisions changed when their shards were last scored: {sum(changed_by_why.values())} "
        f"of {sum(again_by_why.values())} decided again ({sources}); why: {whys}"
    ]


def warning_findings(config: PipelineConfig, lake: Lake, catalog: Catalog) -> list[str]:
    """The warning checks' findings (`moe_dag/assets/reporting.WARNING_CHECKS`), each sentence written
    from the record its stage left, as the check wrote it: a small sample or a share off its target, with
    the key that changes it. Nothing when there is none; a stage not materialised yet has none."""
    keep_rates = {source.name: source.keep_rate for source in config.sources}
    calibration = config.calibration
    found: list[tuple[str, str]] = []
    heads = lake.artifact_dir("quality_heads") / "heads.json"
    if heads.exists():
        thresholds = json.loads(heads.read_text())["thresholds"]
        shortfalls = calibration_shortfalls(
            thresholds, keep_rates, calibration.keep_rate_tolerance, calibration.z
        )
        found += [("calibrated_on_enough_documents", sentence) for sentence in shortfalls]
    try:
        scored = catalog.query(
            "SELECT source, rows_in, kept FROM stage_funnel WHERE stage = 'scored_documents' ORDER BY source"
        )
    except CatalogError:
        scored = []
    for source, rows_in, kept in scored:
        off = keep_rate_violation(source, kept, rows_in, keep_rates[source], calibration.keep_rate_tolerance)
        found += [("keep_rate_on_target", off)] if off else []
    mixture = lake.artifact_dir("tokenized_mixture") / "mixture.json"
    if mixture.exists():
        shares = json.loads(mixture.read_text())["sources"]
        found += [("target_shares_met", s) for s in share_error_violations(shares, config.checks)]
        found += [
            ("sources_within_epoch_cap", s) for s in epoch_cap_shortfalls(shares, config.mixture.max_epochs)
        ]
    if not found:
        return []
    return ["warnings (asset checks of warning severity):", *(f"  {check}: {text}" for check, text in found)]


# (asset, what its gain means): the comparisons' runs leave comparison.json in their run folder.
COMPARISONS = {
    "curation_gain": "curation gain (unfiltered - curated)",
    "moe_gain": "MoE gain over a dense model of equal active parameters (dense - MoE)",
}


def _comparisons(lake: Lake) -> list[str]:
    """Artefact folders are read through the lake: a local copy of an object-store lake's runs."""
    lines = []
    for asset, meaning in COMPARISONS.items():
        runs = lake.artifact_dir(asset)
        pointer = runs / "latest"
        if not pointer.exists():
            continue
        gains = json.loads((runs / pointer.read_text().strip() / "comparison.json").read_text())
        low, high = gains["overall"]["gain_ci"]
        lines.append(
            f"{meaning}: {gains['overall']['gain']:+.3f} bits per byte "
            f"(paired 95% interval {low:+.3f} to {high:+.3f})"
        )
    return lines
