"""Issue 6, items 9 and 10: the lake root never becomes SQL, and `moe-dag query` reads the catalog and
nothing else: no writes, no files outside the lake, one clear line instead of a traceback."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from moe_dag.cli import main as cli
from moe_dag.storage.catalog import Catalog, CatalogError
from moe_dag.storage.lake import Lake


def make_catalog(root: Path, rows: int = 3) -> Catalog:
    lake = Lake(root / "lake")
    lake.write_table(pa.table({"source": ["a"] * rows, "n": list(range(rows))}), "stage", "a")
    catalog = Catalog(root / "catalog.duckdb", lake)
    assert catalog.refresh({"stage": True}) == ["stage"]
    return catalog


def test_a_quote_in_the_lake_root_is_data_not_sql(tmp_path):
    catalog = make_catalog(tmp_path / "it's here")
    assert catalog.query("SELECT count(*) FROM stage") == [(3,)]


def test_a_crafted_lake_root_runs_nothing(tmp_path):
    target = tmp_path / "pwned.csv"
    crafted = tmp_path / f"x', hive_partitioning=false); COPY (SELECT 1) TO '{target}'; --"
    catalog = make_catalog(crafted)
    assert catalog.query("SELECT count(*) FROM stage") == [(3,)]
    assert not target.exists()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("COPY (SELECT 1) TO '{tmp}/out.csv'", "only queries can run on the catalog, not COPY"),
        ("COPY (SELECT 1) TO '{lake}/out.csv'", "only queries can run on the catalog, not COPY"),
        ("ATTACH '{tmp}/other.db' (READ_ONLY false)", "not ATTACH"),
        ("SELECT * FROM read_text('/etc/passwd')", "Permission Error"),
        ("SELECT * FROM read_csv('{tmp}/secret.csv')", "Permission Error"),
        ("DROP VIEW stage", "not DROP"),
        ("SELECT 1; SELECT 2", "exactly one SQL statement"),
        ("SELEC 1", "syntax error"),
    ],
)
def test_query_refuses_writes_and_foreign_files(tmp_path, sql, message):
    catalog = make_catalog(tmp_path)
    (tmp_path / "secret.csv").write_text("a\n1\n")
    sql = sql.format(tmp=tmp_path, lake=tmp_path / "lake")
    with pytest.raises(CatalogError, match=message):
        catalog.query(sql)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "lake" / "out.csv").exists()
    assert catalog.query("SELECT count(*) FROM stage") == [(3,)]


def test_a_query_cannot_unlock_the_configuration(tmp_path):
    catalog = make_catalog(tmp_path)
    with pytest.raises(CatalogError):
        catalog.query("SET enable_external_access = true")
    with catalog.reader() as con, pytest.raises(Exception, match="locked"):
        con.execute("SET enable_external_access = true")


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.yaml"
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [{"name": "a", "kind": "web", "shards": str(tmp_path)}],
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    make_catalog(tmp_path)
    config = write_config(tmp_path)
    assert cli.main(["--config", str(config), "query", "COPY (SELECT 1) TO 'x.csv'"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().count("\n") == 0 and "Traceback" not in captured.err
    assert cli.main(["--config", str(config), "query", "SELECT * FROM missing_view"]) == 2
    assert "missing_view" in capsys.readouterr().err


def test_cli_says_when_a_materialisation_holds_the_catalog(tmp_path, capsys):
    make_catalog(tmp_path)
    config = write_config(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "time.sleep(60)",
            str(tmp_path / "catalog.duckdb"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert cli.main(["--config", str(config), "query", "SELECT 1"]) == 2
        assert time.monotonic() - started < 30
        err = capsys.readouterr().err
        assert "locked by a running materialisation" in err and "Traceback" not in err
    finally:
        holder.kill()
        holder.wait()


def test_cli_shows_every_row_or_a_limit_in_three_formats(tmp_path, capsys):
    make_catalog(tmp_path, rows=45)
    config = str(write_config(tmp_path))
    assert cli.main(["--config", config, "query", "SELECT n FROM stage ORDER BY n"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].strip() == "n" and table[-1] == "(45 rows)" and len(table) == 45 + 3
    assert cli.main(["--config", config, "query", "--format", "json", "SELECT n FROM stage ORDER BY n"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": n} for n in range(45)]
    csv_query = ["--format", "csv", "--limit", "2", "FROM stage ORDER BY n"]
    assert cli.main(["--config", config, "query", *csv_query]) == 0
    captured = capsys.readouterr()
    assert captured.out == "source,n\na,0\na,1\n"
    assert "43 more rows" in captured.err
