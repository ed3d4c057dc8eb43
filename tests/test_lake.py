import pyarrow as pa
import pytest

from moe_dag.storage.catalog import Catalog, chain_breaks
from moe_dag.storage.lake import Lake


def test_write_replaces_only_its_own_partition(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.write_table(pa.table({"source": ["a", "a"], "x": [1, 2]}), "stage", "a")
    lake.write_table(pa.table({"source": ["b"], "x": [3]}), "stage", "b")
    lake.write_table(pa.table({"source": ["b"], "x": [4]}), "stage", "b")  # a rerun of partition b

    assert lake.read_table("stage", "a")["x"].to_pylist() == [1, 2]
    assert lake.read_table("stage", "b")["x"].to_pylist() == [4]
    leftovers = [p.name for p in (tmp_path / "lake" / "stage" / "source=b").iterdir()]
    assert leftovers == ["part-00000.parquet"]  # no temporary file left behind


def test_reading_an_unmaterialised_stage_names_it(tmp_path):
    lake = Lake(tmp_path)
    with pytest.raises(FileNotFoundError, match="prefiltered for source 'code'"):
        lake.read_table("prefiltered", "code")


def test_catalog_views_see_partitions_written_after_the_view(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.write_table(pa.table({"source": ["a"], "keep": [True]}), "stage", "a")
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    assert catalog.refresh({"stage": True, "missing": False}) == ["stage"]

    lake.write_table(pa.table({"source": ["b", "b"], "keep": [True, False]}), "stage", "b")
    rows = catalog.query("SELECT source, count(*) FROM stage GROUP BY source ORDER BY source")
    assert rows == [("a", 1), ("b", 2)]


def test_chain_breaks_reports_rows_lost_between_stages():
    funnel = [
        ("raw_documents", "code", 10, 10, 0),
        ("prefiltered", "code", 10, 7, 3),
        ("deduplicated", "code", 6, 6, 0),  # one row went missing
        ("toxicity_filtered", "code", 6, 6, 0),
        ("scored_documents", "code", 6, 4, 2),
    ]
    assert chain_breaks(funnel) == ["code: prefiltered kept 7 but deduplicated received 6"]


def test_views_glob_every_shard_file_and_skip_records_and_temporaries(tmp_path):
    lake = Lake(tmp_path / "lake")
    for source, key, rows in (("a", "shard-0", 2), ("a", "shard-1", 3), ("b", "shard-0", 1)):
        lake.write_file(
            pa.table({"source": [source] * rows, "keep": [True] * rows}),
            lake.shard_path("stage", source, key),
        )
        lake.write_record("stage", source, key, {"digest": key})
    (tmp_path / "lake" / "stage" / "source=a" / ".tmp-abc-shard-2.parquet.partial").write_bytes(b"half")
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    assert catalog.refresh({"stage": True}) == ["stage"]
    assert catalog.query("SELECT source, count(*) FROM stage GROUP BY source ORDER BY source") == [
        ("a", 5),
        ("b", 1),
    ]
    assert lake.read_table("stage", "a").num_rows == 5 and sorted(lake.records("stage", "a")) == [
        "shard-0",
        "shard-1",
    ]

    lake.remove_shard("stage", "a", "shard-0")
    assert lake.stored_keys("stage", "a") == {"shard-1"} and sorted(lake.records("stage", "a")) == ["shard-1"]
