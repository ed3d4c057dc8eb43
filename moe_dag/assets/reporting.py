"""How every per-source stage runs and reports: shards on Ray, reconciliation, drop reasons, timing.

A per-source asset builds a `StageSpec` (its library work and parameters) and calls `run_source_stage`,
which runs the shards that need it on the Ray resource and returns the stage's counts over every
finished shard of the source (run now or before), read from their completion records. The checks
reconcile those counts, and each stage's input with what the stage before it kept, shard by shard.
"""

from __future__ import annotations

import dagster as dg

from moe_dag.data.engine import StageRun, StageSpec, upstream_inputs
from moe_dag.resources import PipelineResource, RayResource

RECONCILES = "rows_reconcile"


def reconcile_check_spec(asset: str) -> dg.AssetCheckSpec:
    """Blocking: a stage that lost or invented rows must not feed the next one."""
    return dg.AssetCheckSpec(
        RECONCILES, asset=asset, blocking=True, description="rows in = kept + dropped (+ quarantined)"
    )


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


def kept_upstream(pipeline: PipelineResource, upstream: str, source: str) -> int:
    """Rows the upstream stage passed on for `source`, from its completion records."""
    records = pipeline.lake.records(upstream, source).values()
    return sum(int(record["counts"].get("kept", record["counts"].get("documents", 0))) for record in records)


def engine_metadata(run: StageRun) -> dict:
    return {
        "shards": len(run.records),
        "shards_run": run.shards_run,
        "shards_removed": run.shards_removed,
        "seconds": round(run.seconds, 2),
        "documents_per_second": round(run.documents_per_second, 1),
    }


def decision_result(run: StageRun, rows_expected: int, extra: dict | None = None) -> dg.MaterializeResult:
    """Metadata and the reconciliation check of a stage whose rows carry `keep`/`reason`."""
    counts = run.counts
    rows_in, kept, dropped = counts.get("documents", 0), counts.get("kept", 0), counts.get("dropped", 0)
    reasons = dict(sorted(counts.get("reasons", {}).items(), key=lambda kv: (-kv[1], kv[0])))
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
    check = dg.AssetCheckResult(
        check_name=RECONCILES,
        passed=rows_in == kept + dropped == rows_expected,
        metadata={"rows_expected": rows_expected, "rows_in": rows_in, "kept": kept, "dropped": dropped},
    )
    return dg.MaterializeResult(metadata=metadata, check_results=[check])


def reasons_markdown(reasons: dict[str, int]) -> str:
    if not reasons:
        return "nothing dropped"
    rows = "\n".join(f"| `{reason}` | {count} |" for reason, count in reasons.items())
    return f"| reason | documents |\n| --- | --- |\n{rows}"
