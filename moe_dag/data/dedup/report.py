"""What a clusters table says about the corpus: cluster sizes, and duplicates per source and across."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from moe_dag.data.dedup.clusters import clusters_view


@dataclass(frozen=True)
class DuplicateReport:
    cluster_sizes: dict[int, int]  # size (documents) -> number of clusters of that size, sizes >= 2
    # Per source: documents, duplicates found exactly / near, and whose survivor is in the same source
    # or in another one (within + across = exact + near).
    by_source: dict[str, dict[str, int]]
    # (source of the duplicate, source of its survivor) -> documents, for different sources only.
    across: dict[tuple[str, str], int]

    @property
    def duplicates(self) -> int:
        return sum(row["exact"] + row["near"] for row in self.by_source.values())


def duplicate_report(clusters: pa.Table | str | Sequence[str]) -> DuplicateReport:
    """Summaries of a `CLUSTER_SCHEMA` table or its parquet files, computed by DuckDB."""
    with duckdb.connect() as con:
        clusters_view(con, clusters)
        sizes = con.execute(
            """
            SELECT size, count(*) FROM (SELECT count(*) AS size FROM clusters GROUP BY cluster_id)
            WHERE size > 1 GROUP BY size ORDER BY size
            """
        ).fetchall()
        con.execute(
            """
            CREATE TEMP TABLE duplicates AS
            SELECT d.source, d.match, s.source AS survivor_source
            FROM clusters AS d JOIN clusters AS s ON s.id = d.cluster_id
            WHERE NOT d.is_survivor
            """
        )
        by_source = con.execute(
            """
            SELECT c.source, count(*),
                   (SELECT count(*) FROM duplicates AS d WHERE d.source = c.source AND d.match = 'exact'),
                   (SELECT count(*) FROM duplicates AS d WHERE d.source = c.source AND d.match = 'near'),
                   (SELECT count(*) FROM duplicates AS d
                    WHERE d.source = c.source AND d.survivor_source = c.source)
            FROM clusters AS c GROUP BY c.source ORDER BY c.source
            """
        ).fetchall()
        across = con.execute(
            """
            SELECT source, survivor_source, count(*) FROM duplicates
            WHERE source != survivor_source GROUP BY ALL ORDER BY ALL
            """
        ).fetchall()
    return DuplicateReport(
        cluster_sizes={int(size): int(count) for size, count in sizes},
        by_source={
            source: {
                "documents": documents,
                "exact": exact,
                "near": near,
                "within_source": within,
                "across_sources": exact + near - within,
            }
            for source, documents, exact, near, within in by_source
        },
        across={(source, survivor): count for source, survivor, count in across},
    )
