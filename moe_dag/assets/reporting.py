"""How every per-source stage runs and reports: shards on Ray, reconciliation, drop reasons, timing.

A per-source asset builds a `StageSpec` (its library work and parameters) and calls `run_source_stage`,
which runs the shards that need it on the Ray resource and returns the stage's counts over every
finished shard of the source (run now or before), read from their completion records. The checks
reconcile those counts with the stage's own parquet files and with the kept rows of the previous
stage's files (an independent count: a stage that lost rows before counting them fails), bound the
share each drop reason takes (`checks.max_drop_share`), name a source the stage emptied, and name a
language the stage emptied (`checks.min_language_documents`): a source can keep 69% overall while whole
languages of it vanish.
"""

from __future__ import annotations

import dagster as dg

from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.curation.counts import language_counts, slice_counts
from moe_dag.engine import StageRun, StageSpec, upstream_inputs
from moe_dag.operations.bounds import (
    ChecksConfig,
    drop_share_violations,
    duplicate_share_violation,
    emptied_source,
    lost_languages,
    stage_reconciliation,
)

RECONCILES = "rows_reconcile"
NOT_EMPTIED = "source_not_emptied"
LANGUAGES_KEPT = "languages_kept"
DROP_SHARE = "drop_share_per_reason"
DUPLICATE_SHARE = "duplicate_share_in_bounds"
BOUND_DESCRIPTIONS = {
    DROP_SHARE: "no drop reason takes more of the source than checks.max_drop_share allows (blocking: a rule "
    "that drops most of a source is a bug signal, and the stages after it would work on the remnant)",
    DUPLICATE_SHARE: "the share removed as duplicates lies in [checks.min_duplicate_share, "
    "checks.max_duplicate_share] (blocking: 0% where duplicates are expected, or most of a source, "
    "points at the clusters, and everything after dedup would be computed on the wrong set)",
}


def reconcile_check_spec(asset: str) -> dg.AssetCheckSpec:
    """Blocking: a stage that lost or invented rows must not feed the next one."""
    return dg.AssetCheckSpec(
        RECONCILES,
        asset=asset,
        blocking=True,
        description="rows in = kept + dropped (+ quarantined), and rows in = the rows the previous stage "
        "kept, counted from its parquet files",
    )


def decision_check_specs(asset: str, bounds: str | None = None) -> list[dg.AssetCheckSpec]:
    """The checks of a stage whose rows carry `keep`/`reason`; `bounds` adds DROP_SHARE or DUPLICATE_SHARE."""
    specs = [
        reconcile_check_spec(asset),
        dg.AssetCheckSpec(
            NOT_EMPTIED,
            asset=asset,
            blocking=True,
            description="the source kept at least one document (blocking: an emptied source stops the "
            "pipeline at the stage that emptied it; the check names the stage, the top reasons and what to "
            "change)",
        ),
        dg.AssetCheckSpec(
            LANGUAGES_KEPT,
            asset=asset,
            blocking=True,
            description="every language with at least checks.min_language_documents documents at the stage's "
            "input kept at least one (blocking: a rule that cannot read a script drops a whole language "
            "while the source as a whole looks healthy)",
        ),
    ]
    if bounds is not None:
        specs.append(
            dg.AssetCheckSpec(bounds, asset=asset, blocking=True, description=BOUND_DESCRIPTIONS[bounds])
        )
    return specs


def run_source_stage(
    context: dg.AssetExecutionContext,
    pipeline: PipelineResource,
    ray: RayResource,
    spec: StageSpec,
    upstream: str,
) -> StageRun:
    """Run `spec` over the finished shards of `upstream` for the partition's source."""
    source = context.partition_key
    inputs = upstream_inputs(pipeline.lake, upstream, source)
    return ray.run_stage(context, spec, pipeline.lake, source, inputs)


def engine_metadata(run: StageRun) -> dict:
    return {
        "shards": len(run.records),
        "shards_run": run.shards_run,
        "shards_removed": run.shards_removed,
        "seconds": round(run.seconds, 2),
        "documents_per_second": round(run.documents_per_second, 1),
    }


def decision_result(
    context: dg.AssetExecutionContext,
    pipeline: PipelineResource,
    run: StageRun,
    upstream: str,
    checks: ChecksConfig,
    extra: dict | None = None,
    bounds: str | None = None,
) -> dg.MaterializeResult:
    """Metadata and checks of a stage whose rows carry `keep`/`reason` (see `decision_check_specs`), held
    to the bounds in `checks` (those of the stage's settings object).

    The reconciliation counts the stage's rows three ways: its completion records, its own parquet
    files, and the kept rows of `upstream`'s parquet files (what the stage should have received)."""
    counts, source, lake = run.counts, run.source, pipeline.lake
    rows_in, kept, dropped = counts.get("documents", 0), counts.get("kept", 0), counts.get("dropped", 0)
    reasons = dict(sorted(counts.get("reasons", {}).items(), key=lambda kv: (-kv[1], kv[0])))
    upstream_rows, upstream_kept = slice_counts(lake, upstream, source)
    file_rows, file_kept = slice_counts(lake, run.stage, source)
    metadata = {
        "rows_in": rows_in,
        "kept": kept,
        "dropped": dropped,
        "kept_fraction": round(kept / rows_in, 4) if rows_in else 0.0,
        "drop_reasons": dg.MetadataValue.md(reasons_markdown(reasons)),
        "dagster/row_count": rows_in,
        **engine_metadata(run),
        **(extra or {}),
    }
    reconciliation = stage_reconciliation(
        run.stage,
        source,
        upstream,
        counted=(rows_in, kept, dropped),
        in_files=(file_rows, file_kept),
        upstream_kept=upstream_kept,
    )
    reconciled = problems_result(
        RECONCILES,
        reconciliation,
        {
            "rows_in": rows_in,
            "kept": kept,
            "dropped": dropped,
            "rows_in_files": file_rows,
            "kept_in_files": file_kept,
            f"kept_by_{upstream}": upstream_kept,
            f"rows_of_{upstream}": upstream_rows,
        },
    )
    # Only the wording of a failed check: the config keys that govern each reason, named for the reader.
    settings = pipeline.config.reason_settings(run.stage, source)
    emptied = emptied_source(run.stage, source, reasons, rows_in, kept, settings)
    if emptied:
        context.log.warning(emptied)
        metadata["emptied_source"] = emptied
    by_language = language_counts(lake, run.stage, source)
    lost = lost_languages(run.stage, source, by_language, checks)
    for problem in lost:
        context.log.warning(problem)
    kept_by_language = {language: {"in": n, "kept": k} for language, (n, k) in by_language.items()}
    results = [
        reconciled,
        problems_result(NOT_EMPTIED, [emptied] if emptied else [], {"kept": kept}),
        problems_result(LANGUAGES_KEPT, lost, {"kept_by_language": dg.MetadataValue.json(kept_by_language)}),
    ]
    if bounds is not None:
        results.append(_bound_result(bounds, run, reasons, checks, settings))
    return dg.MaterializeResult(metadata=metadata, check_results=results)


def _bound_result(
    bounds: str, run: StageRun, reasons: dict[str, int], config: ChecksConfig, settings: dict[str, str]
) -> dg.AssetCheckResult:
    rows_in, dropped = run.counts.get("documents", 0), run.counts.get("dropped", 0)
    if bounds == DROP_SHARE:
        largest = next(iter(reasons.values()), 0) / rows_in if rows_in else 0.0
        problems = drop_share_violations(run.stage, run.source, reasons, rows_in, config, settings)
        return problems_result(DROP_SHARE, problems, {"largest_reason_share": round(largest, 4)})
    problem = duplicate_share_violation(run.source, rows_in, dropped, config)
    share = dropped / rows_in if rows_in else 0.0
    return problems_result(
        DUPLICATE_SHARE, [problem] if problem else [], {"duplicate_share": round(share, 4)}
    )


# Checks whose failure is a finding to look at, not an error: each a small sample or a share off its
# target, shown as a warning in the UI and in `moe-dag summary`, with the config key that changes it.
WARNING_CHECKS = (
    "calibrated_on_enough_documents",
    "keep_rate_on_target",
    "target_shares_met",
    "sources_within_epoch_cap",
)


def problems_result(check: str, problems: list[str], figures: dict | None = None) -> dg.AssetCheckResult:
    """A check result that fails with its problems, one sentence each, in the description and metadata;
    of warning severity for WARNING_CHECKS."""
    return dg.AssetCheckResult(
        check_name=check,
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN if check in WARNING_CHECKS else dg.AssetCheckSeverity.ERROR,
        description="; ".join(problems) or None,
        metadata={"problems": dg.MetadataValue.json(problems), **(figures or {})},
    )


def reasons_markdown(reasons: dict[str, int]) -> str:
    if not reasons:
        return "nothing dropped"
    rows = "\n".join(f"| `{reason}` | {count} |" for reason, count in reasons.items())
    return f"| reason | documents |\n| --- | --- |\n{rows}"
