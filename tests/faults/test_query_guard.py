"""Issue 23, item 1: `moe-dag query` runs reads only. The statement check reads DuckDB's own parse
(the statement inside EXPLAIN too), and the connection it runs on cannot write a file anywhere, the
lake included, even for a statement the check let through."""

from pathlib import Path

import pyarrow as pa
import pytest

from moe_dag.cli import main as cli
from moe_dag.storage.catalog import Catalog, CatalogError
from moe_dag.storage.lake import Lake
from tests.faults.test_catalog_access import write_config

# Each writes, installs, attaches or reconfigures; {lake} and {tmp} are filled in per test.
WRITING_STATEMENTS = {
    "COPY": "COPY (SELECT 'x' AS id) TO '{lake}/stage/source=a/zz.parquet'",
    "COPY outside": "COPY (SELECT 1) TO '{tmp}/out.csv'",
    "EXPORT": "EXPORT DATABASE '{lake}/exported'",
    "ATTACH": "ATTACH '{lake}/other.duckdb'",
    "INSTALL": "INSTALL httpfs",
    "LOAD": "LOAD httpfs",
    "SET": "SET enable_external_access = true",
    "PRAGMA": "PRAGMA profiling_output = '{lake}/profile.json'",
    "CALL": "CALL pragma_version()",
}


def make_catalog(root: Path) -> Catalog:
    lake = Lake(root / "lake")
    lake.write_table(pa.table({"source": ["a"] * 3, "n": [0, 1, 2]}), "stage", "a")
    catalog = Catalog(root / "catalog.duckdb", lake)
    assert catalog.refresh({"stage": True}) == ["stage"]
    with catalog.connect() as con:
        con.execute("CREATE TABLE stage_funnel AS SELECT 'stage' AS stage, 3 AS rows_in")
    return catalog


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


@pytest.mark.parametrize("wrapper", ["{}", "EXPLAIN {}", "EXPLAIN ANALYZE {}", "EXPLAIN (FORMAT json) {}"])
@pytest.mark.parametrize("kind", list(WRITING_STATEMENTS))
def test_the_guard_refuses_every_statement_that_is_not_a_read(tmp_path, kind, wrapper):
    catalog = make_catalog(tmp_path)
    before = files_under(tmp_path)
    sql = wrapper.format(WRITING_STATEMENTS[kind].format(lake=tmp_path / "lake", tmp=tmp_path))
    # DuckDB's grammar has no EXPLAIN of EXPORT or ATTACH: those are refused as syntax errors.
    with pytest.raises(CatalogError, match="only queries can run on the catalog|syntax error"):
        catalog.query(sql)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(
    "kind", ["COPY", "COPY outside", "EXPORT", "ATTACH", "INSTALL", "LOAD", "SET", "PRAGMA"]
)
def test_the_connection_itself_writes_nothing_when_the_guard_is_passed_by(tmp_path, kind):
    catalog = make_catalog(tmp_path)
    before = files_under(tmp_path)
    sql = WRITING_STATEMENTS[kind].format(lake=tmp_path / "lake", tmp=tmp_path)
    with catalog.reader() as con:
        for statement in (sql, f"EXPLAIN ANALYZE {sql}"):
            with pytest.raises(Exception):  # noqa: B017 - each kind fails in its own DuckDB error class
                con.execute(statement)
        assert con.execute("SELECT count(*) FROM stage").fetchall() == [(3,)]
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_parquet('moedaglake://../catalog.duckdb')",
        "SELECT * FROM read_text('{tmp}/catalog.duckdb')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM query('COPY (SELECT 1) TO ''{tmp}/lake/x.csv''')",  # a write inside a SELECT
    ],
)
def test_the_connection_reads_nothing_outside_the_lake(tmp_path, sql):
    catalog = make_catalog(tmp_path)
    with pytest.raises(CatalogError):
        catalog.query(sql.format(tmp=tmp_path))


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("SELECT count(*) FROM stage", [(3,)]),
        ("FROM stage_funnel", [("stage", 3)]),
        ("WITH s AS (SELECT n FROM stage) SELECT max(n) FROM s", [(2,)]),
        ("SELECT count(*) FROM (DESCRIBE stage)", [(2,)]),
    ],
)
def test_reads_still_run(tmp_path, sql, rows):
    assert make_catalog(tmp_path).query(sql) == rows


@pytest.mark.parametrize("sql", ["EXPLAIN SELECT * FROM stage", "EXPLAIN ANALYZE SELECT count(*) FROM stage"])
def test_explain_of_a_read_runs(tmp_path, sql):
    assert make_catalog(tmp_path).query(sql)


def test_the_reported_explain_analyze_copy_changes_no_file(tmp_path, capsys):
    catalog = make_catalog(tmp_path)
    config = write_config(tmp_path)
    target = tmp_path / "lake" / "stage" / "source=a" / "zz.parquet"
    sql = (
        "EXPLAIN ANALYZE COPY (SELECT 'x' AS id, 'evil' AS text, 'code' AS source, true AS keep) "
        f"TO '{target}'"
    )
    assert cli.main(["--config", str(config), "query", sql]) == 2
    assert "not COPY" in capsys.readouterr().err
    assert not target.exists()
    assert catalog.query("SELECT count(*) FROM stage") == [(3,)]
