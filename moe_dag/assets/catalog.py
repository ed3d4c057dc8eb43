"""document_catalog: DuckDB views over every stage, and the per-stage reconciliation of each source."""

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.reporting import problems_result
from moe_dag.assets.resources import PipelineResource
from moe_dag.settings.quality import catalog_settings
from moe_dag.storage.catalog import LAKE_STAGES, Catalog, chain_breaks


@dg.asset(
    group_name="quality",
    kinds={"duckdb"},
    deps=["scored_documents"],
    metadata=operated(1, catalog_settings),
    pool="duckdb_catalog",
    check_specs=[dg.AssetCheckSpec("stages_chain", asset="document_catalog", blocking=True)],
)
def document_catalog(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Views over the lake plus `stage_funnel` (per source, rows in, kept and dropped at each stage) and
    `language_funnel` (per source and language, documents in and kept at the end)."""
    catalog: Catalog = pipeline.catalog
    views = catalog.refresh(LAKE_STAGES)
    funnel = catalog.write_stage_funnel()
    languages = catalog.write_language_funnel()
    broken = chain_breaks(funnel)
    table = "\n".join(f"| {s} | {src} | {i} | {k} | {d} |" for s, src, i, k, d in funnel)
    return dg.MaterializeResult(
        metadata={
            "catalog": dg.MetadataValue.path(str(catalog.path)),
            "views": dg.MetadataValue.json(views),
            "kept_share_by_language": dg.MetadataValue.json(
                {f"{source}/{language}": share for source, language, _, _, share in languages}
            ),
            "funnel": dg.MetadataValue.md(
                "| stage | source | in | kept | dropped |\n| --- | --- | --- | --- | --- |\n" + table
            ),
        },
        check_results=[problems_result("stages_chain", broken)],
    )
