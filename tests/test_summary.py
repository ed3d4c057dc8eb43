"""`moe-dag summary` after partial runs: what exists is reported, what does not is named, no traceback."""

import duckdb
import pyarrow as pa
import yaml

from moe_dag.cli import main as cli
from moe_dag.cli.summary import format_summary
from moe_dag.config import load_config


def write_config(tmp_path):
    path = tmp_path / "pipeline.yaml"
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [
            {"name": "web", "kind": "web", "shards": str(tmp_path)},
            {"name": "social", "kind": "forum", "shards": str(tmp_path)},
        ],
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def test_summary_of_nothing_materialised_names_what_is_missing(tmp_path, capsys):
    path = write_config(tmp_path)
    assert cli.main(["--config", str(path), "summary"]) == 0
    out = capsys.readouterr().out
    for section in ["documents per stage", "duplicates", "quality heads", "mixture", "proxy evaluation"]:
        assert f"{section}: not materialised yet" in out
    assert "Traceback" not in out


def test_summary_reports_a_source_that_lost_every_document(tmp_path):
    path = write_config(tmp_path)
    (tmp_path / "lake").mkdir()
    with duckdb.connect(str(tmp_path / "catalog.duckdb")) as con:
        con.execute(
            "CREATE TABLE stage_funnel AS SELECT * FROM (VALUES "
            "('raw_documents', 'web', 5, 5, 0), ('prefiltered', 'web', 5, 3, 2), "
            "('raw_documents', 'social', 4, 4, 0), ('prefiltered', 'social', 4, 0, 4)) "
            "t(stage, source, rows_in, kept, dropped)"
        )
        con.execute("CREATE TABLE quarantine AS SELECT 'web' AS source WHERE false")
    summary = format_summary(load_config(path))
    lines = summary.splitlines()
    assert any(line.startswith("prefiltered") and line.split()[1:] == ["3", "0"] for line in lines)
    assert any(line.startswith("deduplicated") and line.split()[1:] == ["0", "0"] for line in lines)
    assert "source 'social' lost every document at prefiltered" in summary
    assert "source 'web' lost" not in summary
    assert "mixture: not materialised yet (needs tokenized_mixture)" in summary


def test_catalog_and_summary_report_the_kept_share_of_each_language(tmp_path):
    """Issue 20: a source could keep 69% while whole languages of it vanished, and nothing showed it."""
    from moe_dag.storage.catalog import Catalog
    from moe_dag.storage.lake import Lake

    path = write_config(tmp_path)
    lake = Lake(tmp_path / "lake")
    languages = ["en"] * 10 + ["el"] * 10 + [None] * 2
    ids = [f"d{i}" for i in range(len(languages))]
    # Two more: one in a language the source does not accept, one duplicate. Neither counts as a loss.
    languages += ["fr", "en"]
    ids = [f"d{i}" for i in range(len(languages))]
    web = ["web"] * len(ids)
    prefilter_reasons = [None] * 22 + ["language_not_allowed", None]
    prefiltered = pa.table(
        {"id": ids, "source": web, "language": languages, "keep": [True] * 22 + [False, True]}
    ).append_column("reason", pa.array(prefilter_reasons, pa.string()))
    dedup_reasons = pa.array([None] * 23 + ["exact_duplicate"], pa.string())
    deduplicated = pa.table({"id": ids, "source": web, "keep": [True] * 23 + [False]})
    kept = [i < 7 for i in range(10)] + [False] * 10 + [True] * 2 + [False, False]
    scored = pa.table({"id": ids, "source": web, "keep": kept})
    lake.write_table(prefiltered, "prefiltered", "web")
    lake.write_table(deduplicated.append_column("reason", dedup_reasons), "deduplicated", "web")
    lake.write_table(scored, "scored_documents", "web")
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    catalog.refresh({"prefiltered": True, "deduplicated": True, "scored_documents": True})
    rows = catalog.write_language_funnel()
    assert rows == [("web", "el", 10, 0, 0.0), ("web", "en", 10, 7, 0.7), ("web", "und", 2, 2, 1.0)]

    summary = format_summary(load_config(path))
    assert "kept share per language in 'web': 0.35 over 2 languages" in summary
    assert "el 0.00* (0/10)  en 0.70* (7/10)" in summary
    assert "lost every document: el" in summary
