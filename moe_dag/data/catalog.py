"""The DuckDB catalog: one database file with views over the lake's parquet.

Every table in the lake carries its own `source` column, so views read without hive partitioning.
Views read the parquet at query time, so a partition written after the view was made shows up without
touching the database. DuckDB allows one writer at a time: only global steps call `refresh`, never
per-source partition runs (which may run in parallel).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from moe_dag.data.lake import Lake

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
    "calibration_sample": False,
    "oracle_labels": False,
    "oracle_label_failures": False,
    "oracle_label_cache": False,
    "scored_documents": True,
    "proxy_eval": False,
}
DECISION_STAGES = ["prefiltered", "deduplicated", "toxicity_filtered", "scored_documents"]
FUNNEL_STAGES = ["raw_documents", *DECISION_STAGES]

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


class Catalog:
    def __init__(self, path: str | Path, lake: Lake) -> None:
        self.path = Path(path)
        self.lake = lake

    def connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return duckdb.connect(str(self.path), read_only=read_only)

    def refresh(self, stages: dict[str, bool] = LAKE_STAGES) -> list[str]:
        """Create or replace one view per stage that has data; `stages` maps name -> partitioned."""
        created = []
        with self.connect() as con:
            for stage, partitioned in stages.items():
                pattern = self.lake.glob_pattern(stage, partitioned)
                if not self.lake.fs.glob(pattern.split("://", 1)[-1]):
                    continue
                con.execute(
                    f"CREATE OR REPLACE VIEW {stage} AS SELECT * FROM read_parquet("
                    f"'{pattern}', hive_partitioning = false, union_by_name = true)"
                )
                created.append(stage)
        return created

    def write_stage_funnel(self) -> list[tuple]:
        """(Re)build `stage_funnel` from the stage views; returns its rows."""
        with self.connect() as con:
            con.execute(funnel_sql())
            return con.execute("SELECT stage, source, rows_in, kept, dropped FROM stage_funnel").fetchall()

    def query(self, sql: str) -> list[tuple]:
        with self.connect(read_only=True) as con:
            return con.execute(sql).fetchall()


def chain_breaks(funnel: list[tuple]) -> list[str]:
    """Each stage must receive exactly the rows the stage before it kept, source by source."""
    order = FUNNEL_STAGES
    by_key = {(stage, source): (rows_in, kept) for stage, source, rows_in, kept, _ in funnel}
    breaks = []
    for source in sorted({source for _, source, *_ in funnel}):
        for before, after in zip(order, order[1:], strict=False):
            kept_before = by_key.get((before, source), (0, 0))[1]
            rows_after = by_key.get((after, source), (0, 0))[0]
            if kept_before != rows_after:
                breaks.append(f"{source}: {before} kept {kept_before} but {after} received {rows_after}")
    return breaks
