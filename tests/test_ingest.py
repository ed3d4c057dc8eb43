"""Ingest: ids namespaced by source, ids repeated within a source quarantined with file and line."""

import json

import pyarrow.compute as pc

from moe_dag.curation.ingest import ingest_source
from moe_dag.storage.lake import Lake


def _write_shard(path, ids):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": f"the text of {i}"}) + "\n" for i in ids))


def _state(lake, source):
    documents = lake.read_table("raw_documents", source).sort_by("id")
    quarantine = lake.read_table("quarantine", source).sort_by(
        [("shard", "ascending"), ("line", "ascending")]
    )
    return documents.select(["id", "shard", "line"]).to_pylist(), quarantine.select(
        ["shard", "line", "error"]
    ).to_pylist()


def test_an_id_repeated_within_a_source_is_quarantined_with_file_and_line(tmp_path):
    corpus, lake = tmp_path / "web", Lake(tmp_path / "lake")
    _write_shard(corpus / "a.jsonl", ["x", "y", "x"])
    _write_shard(corpus / "b.jsonl", ["z", "y"])
    run = ingest_source(lake, "web", str(corpus), workers=0)

    documents, quarantine = _state(lake, "web")
    assert [d["id"] for d in documents] == ["web/x", "web/y", "web/z"]
    a, b = str(corpus / "a.jsonl"), str(corpus / "b.jsonl")
    assert quarantine == [
        {"shard": a, "line": 3, "error": f"duplicate id 'web/x': first at {a} line 1"},
        {"shard": b, "line": 2, "error": f"duplicate id 'web/y': first at {a} line 2"},
    ]
    counts = run.counts
    assert (counts["records"], counts["kept"], counts["quarantined"], counts["duplicate_ids"]) == (5, 3, 2, 2)

    again = ingest_source(lake, "web", str(corpus), workers=0)
    assert again.shards_run == 0 and _state(lake, "web") == (documents, quarantine)


def test_sources_may_share_ids(tmp_path):
    lake = Lake(tmp_path / "lake")
    for source in ("web", "code"):
        _write_shard(tmp_path / source / "0.jsonl", ["same"])
        ingest_source(lake, source, str(tmp_path / source), workers=0)
    ids = (
        lake.read_table("raw_documents", "web")["id"].to_pylist()
        + lake.read_table("raw_documents", "code")["id"].to_pylist()
    )
    assert ids == ["web/same", "code/same"]
    assert lake.read_table("quarantine", "web").num_rows == 0


def test_incremental_ingest_matches_reading_from_scratch(tmp_path):
    """A shard sorting first takes an id over; removing it gives the id back. The stages after see new
    digests for the rewritten shard only."""
    corpus, lake = tmp_path / "web", Lake(tmp_path / "lake")
    _write_shard(corpus / "b.jsonl", ["x", "y"])
    ingest_source(lake, "web", str(corpus), workers=0)
    digest_before = lake.read_record("raw_documents", "web", "b")["digest"]

    _write_shard(corpus / "a.jsonl", ["x"])
    run = ingest_source(lake, "web", str(corpus), workers=0)
    assert run.shards_run == 1
    scratch = Lake(tmp_path / "scratch")
    ingest_source(scratch, "web", str(corpus), workers=0)
    assert _state(lake, "web") == _state(scratch, "web")
    record = lake.read_record("raw_documents", "web", "b")
    assert record["digest"] == digest_before and record["output_digest"] != digest_before

    (corpus / "a.jsonl").unlink()
    ingest_source(lake, "web", str(corpus), workers=0)
    documents, quarantine = _state(lake, "web")
    assert [d["id"] for d in documents] == ["web/x", "web/y"] and quarantine == []
    assert lake.stored_keys("raw_documents", "web") == {"b"}


def test_the_reconcile_counts_records_of_a_lone_cr_file(tmp_path):
    corpus, lake = tmp_path / "web", Lake(tmp_path / "lake")
    corpus.mkdir()
    (corpus / "mac.jsonl").write_bytes(b'{"id": 1, "text": "a"}\r{"id": 2, "text": "b"}\r{"id": 3}\r')
    counts = ingest_source(lake, "web", str(corpus), workers=0).counts
    assert (counts["records"], counts["kept"], counts["quarantined"]) == (3, 2, 1)
    errors = lake.read_table("quarantine", "web")
    assert errors.select(["line", "error"]).to_pylist() == [{"line": 3, "error": "missing field 'text'"}]
    assert pc.all(pc.equal(errors["source"], "web")).as_py()
