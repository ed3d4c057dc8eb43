"""What every filtering stage reports: reconciliation, drop reasons and timing, as metadata and checks."""

import time
from collections.abc import Sequence

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.data.filters import DocumentFilter, run_filters
from moe_dag.data.lake import Lake
from moe_dag.data.schema import kept_rows, reason_counts

RECONCILES = "rows_reconcile"


def reconcile_check_spec(asset: str) -> dg.AssetCheckSpec:
    """Blocking: a stage that lost or invented rows must not feed the next one."""
    return dg.AssetCheckSpec(
        RECONCILES, asset=asset, blocking=True, description="rows in = kept + dropped (+ quarantined)"
    )


def decision_result(
    table: pa.Table, rows_in: int, seconds: float, extra: dict | None = None, quarantined: int = 0
) -> dg.MaterializeResult:
    """Metadata and the reconciliation check for a table carrying `keep`/`reason` columns."""
    kept = int(pc.sum(table["keep"]).as_py() or 0)
    dropped = table.num_rows - kept
    reasons = reason_counts(table)
    reconciles = rows_in == kept + dropped + quarantined
    metadata = {
        "rows_in": rows_in,
        "kept": kept,
        "dropped": dropped,
        "kept_fraction": round(kept / rows_in, 4) if rows_in else 0.0,
        "drop_reasons": dg.MetadataValue.md(reasons_markdown(reasons)),
        "seconds": round(seconds, 2),
        "dagster/row_count": table.num_rows,
        **(extra or {}),
    }
    check = dg.AssetCheckResult(
        check_name=RECONCILES,
        passed=reconciles,
        metadata={"rows_in": rows_in, "kept": kept, "dropped": dropped, "quarantined": quarantined},
    )
    return dg.MaterializeResult(metadata=metadata, check_results=[check])


def reasons_markdown(reasons: dict[str, int]) -> str:
    if not reasons:
        return "nothing dropped"
    rows = "\n".join(f"| `{reason}` | {count} |" for reason, count in reasons.items())
    return f"| reason | documents |\n| --- | --- |\n{rows}"


def run_filter_stage(
    lake: Lake, source: str, upstream: str, stage: str, filters: Sequence[DocumentFilter]
) -> dg.MaterializeResult:
    """Run `filters` over the rows `upstream` kept for `source` and write every row to `stage`."""
    table = lake.read_table(upstream, source)
    documents = kept_rows(table) if "keep" in table.column_names else table
    started = time.perf_counter()
    decided, stats = run_filters(documents, filters)
    lake.write_table(decided, stage, source)
    return decision_result(
        decided,
        documents.num_rows,
        time.perf_counter() - started,
        extra={"filters": dg.MetadataValue.json(stats.as_dict())},
    )
