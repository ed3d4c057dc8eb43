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


class Catalog:
    def __init__(self, path: str | Path, lake: Lake) -> None:
        self.path = Path(path)
        self.lake = lake

    def connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return duckdb.connect(str(self.path), read_only=read_only)

    def refresh(self, stages: dict[str, bool]) -> list[str]:
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

    def query(self, sql: str) -> list[tuple]:
        with self.connect(read_only=True) as con:
            return con.execute(sql).fetchall()
