"""What a clusters table says about the corpus: cluster sizes, and duplicates per source and across."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from moe_dag.curation.dedup.clusters import clusters_view
from moe_dag.storage.lake import duckdb_reading


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
    with duckdb_reading(clusters) as con:
        clusters_view(con, clusters)
        sizes = con.execute(
            """
            SELECT size, count(*) FROM (SELECT count(*) AS size FROM clusters GROUP BY cluster_id)
            WHERE size > 1 GROUP BY size
            """
        ).fetchall()
        rows = con.execute(
            """
            SELECT d.source, d.match, s.source, count(*)
            FROM clusters AS d LEFT JOIN clusters AS s ON NOT d.is_survivor AND s.id = d.cluster_id
            GROUP BY ALL
            """
        ).fetchall()
    return report_from_counts(dict(sizes), rows)


def report_from_counts(
    cluster_sizes: dict[int, int], rows: list[tuple[str, str | None, str | None, int]]
) -> DuplicateReport:
    """The report from cluster sizes and (source, match, survivor's source, documents) counts, where
    survivors count with match and survivor's source None; counts of disjoint rows may repeat a key."""
    by_source: dict[str, dict[str, int]] = {}
    across: dict[tuple[str, str], int] = {}
    for source, match, survivor_source, count in rows:
        row = by_source.setdefault(
            source, {"documents": 0, "exact": 0, "near": 0, "within_source": 0, "across_sources": 0}
        )
        row["documents"] += count
        if match is None:
            continue
        row[match] += count
        if survivor_source == source:
            row["within_source"] += count
        else:
            row["across_sources"] += count
            across[(source, survivor_source)] = across.get((source, survivor_source), 0) + count
    return DuplicateReport(
        cluster_sizes={int(size): int(count) for size, count in sorted(cluster_sizes.items())},
        by_source=dict(sorted(by_source.items())),
        across=dict(sorted(across.items())),
    )
