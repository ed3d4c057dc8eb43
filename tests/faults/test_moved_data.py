"""Issue 35, item 8: a corpus moved or copied elsewhere (file times kept) and a catalog copied with its
lake are recognised for what they are: the moved shards are ingested again from where they are now, so
every row names a file that exists and the line check holds; the copied catalog reads the lake it is
opened with."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa

from moe_dag.curation.counts import unreconciled_shards
from moe_dag.curation.ingest import ingest_source
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake


def test_a_moved_corpus_is_ingested_from_its_new_place_and_its_lines_reconcile(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for shard in range(2):
        lines = (json.dumps({"id": f"{shard}-{i}", "text": f"words {i}"}) for i in range(25))
        (corpus / f"code-000{shard}.jsonl").write_text("\n".join(lines) + "\n")
    lake = Lake(tmp_path / "lake")
    assert ingest_source(lake, "code", str(corpus), workers=0).shards_run == 2

    moved = tmp_path / "elsewhere" / "corpus"
    shutil.copytree(corpus, moved)  # copy2: the file times are kept
    shutil.rmtree(corpus)
    assert ingest_source(lake, "code", str(moved), workers=0).shards_run == 2
    assert unreconciled_shards(lake, "code", str(moved), workers=0) == []
    shards = set(lake.read_table("raw_documents", "code", columns=["shard"])["shard"].to_pylist())
    assert shards == {str(moved / "code-0000.jsonl"), str(moved / "code-0001.jsonl")}


def test_a_copied_catalog_reads_the_lake_it_is_opened_with(tmp_path):
    lake = Lake(tmp_path / "first" / "lake")
    lake.write_table(pa.table({"source": ["a"] * 3, "n": [1, 2, 3]}), "prefiltered", "a")
    assert Catalog(tmp_path / "first" / "catalog.duckdb", lake).refresh({"prefiltered": True})

    shutil.copytree(tmp_path / "first", tmp_path / "second")
    shutil.rmtree(tmp_path / "first")
    copied = Catalog(tmp_path / "second" / "catalog.duckdb", Lake(tmp_path / "second" / "lake"))
    assert copied.query("SELECT sum(n) FROM prefiltered") == [(6,)]
