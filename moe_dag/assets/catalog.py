"""document_catalog: DuckDB views over every stage, and the per-stage reconciliation of each source."""

import dagster as dg

from moe_dag.data.catalog import Catalog
from moe_dag.resources import PipelineResource

# Stage name -> whether it is written per source. Order is the order documents flow through.
LAKE_STAGES = {
    "raw_documents": True,
    "quarantine": True,
    "prefiltered": True,
    "minhash_signatures": True,
    "dedup_clusters": False,
    "deduplicated": True,
    "toxicity_filtered": True,
    "oracle_sample": False,
    "oracle_labels": False,
    "scored_documents": True,
    "proxy_eval": False,
}
DECISION_STAGES = ["prefiltered", "deduplicated", "toxicity_filtered", "scored_documents"]

FUNNEL_SQL = """
CREATE OR REPLACE TABLE stage_funnel AS
SELECT 'raw_documents' AS stage, source, count(*) AS rows_in, count(*) AS kept, 0 AS dropped
FROM raw_documents GROUP BY source
{unions}
ORDER BY source, stage
"""


def funnel_sql() -> str:
    unions = "\n".join(
        f"UNION ALL SELECT '{stage}', source, count(*), count(*) FILTER (WHERE keep), "
        f"count(*) FILTER (WHERE NOT keep) FROM {stage} GROUP BY source"
        for stage in DECISION_STAGES
    )
    return FUNNEL_SQL.format(unions=unions)


@dg.asset(
    group_name="quality",
    kinds={"duckdb"},
    deps=["scored_documents"],
    pool="duckdb_catalog",
    check_specs=[dg.AssetCheckSpec("stages_chain", asset="document_catalog", blocking=True)],
)
def document_catalog(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Views over the lake plus `stage_funnel`: per source, rows in, kept and dropped at each stage."""
    catalog: Catalog = pipeline.catalog
    views = catalog.refresh(LAKE_STAGES)
    with catalog.connect() as con:
        con.execute(funnel_sql())
        funnel = con.execute("SELECT stage, source, rows_in, kept, dropped FROM stage_funnel").fetchall()
    broken = chain_breaks(funnel)
    table = "\n".join(f"| {s} | {src} | {i} | {k} | {d} |" for s, src, i, k, d in funnel)
    return dg.MaterializeResult(
        metadata={
            "catalog": dg.MetadataValue.path(str(catalog.path)),
            "views": dg.MetadataValue.json(views),
            "funnel": dg.MetadataValue.md(
                "| stage | source | in | kept | dropped |\n| --- | --- | --- | --- | --- |\n" + table
            ),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="stages_chain",
                passed=not broken,
                metadata={"breaks": dg.MetadataValue.json(broken)},
            )
        ],
    )


def chain_breaks(funnel: list[tuple]) -> list[str]:
    """Each stage must receive exactly the rows the stage before it kept, source by source."""
    order = ["raw_documents", *DECISION_STAGES]
    by_key = {(stage, source): (rows_in, kept) for stage, source, rows_in, kept, _ in funnel}
    breaks = []
    for source in sorted({source for _, source, *_ in funnel}):
        for before, after in zip(order, order[1:], strict=False):
            kept_before = by_key.get((before, source), (0, 0))[1]
            rows_after = by_key.get((after, source), (0, 0))[0]
            if kept_before != rows_after:
                breaks.append(f"{source}: {before} kept {kept_before} but {after} received {rows_after}")
    return breaks
