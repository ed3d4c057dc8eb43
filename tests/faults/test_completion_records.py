"""Issue 23, item 9: a completion record vouches for its files only while they are there with the size it
wrote down; a shard whose file was deleted or cut is redone on the next run."""

from __future__ import annotations

import json

from moe_dag.curation.counts import slice_counts
from moe_dag.curation.ingest import ingest_source
from moe_dag.storage.lake import Lake


def _corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for shard in range(3):
        lines = (json.dumps({"id": f"{shard}-{i}", "text": f"words {i}"}) for i in range(20))
        (corpus / f"code-000{shard}.jsonl").write_text("\n".join(lines) + "\n")
    return corpus


def test_a_deleted_output_file_is_redone_not_trusted_to_its_record(tmp_path):
    corpus, lake = _corpus(tmp_path), Lake(tmp_path / "lake")
    assert ingest_source(lake, "code", str(corpus), workers=0).shards_run == 3
    (tmp_path / "lake" / "raw_documents" / "source=code" / "code-0001.parquet").unlink()
    lines: list[str] = []
    run = ingest_source(lake, "code", str(corpus), workers=0, log=lines.append)
    assert run.shards_run == 1 and "2 shards already done, 1 to do" in lines[0]
    assert slice_counts(lake, "raw_documents", "code") == (60, 60)


def test_an_output_file_of_another_size_is_redone(tmp_path):
    corpus, lake = _corpus(tmp_path), Lake(tmp_path / "lake")
    ingest_source(lake, "code", str(corpus), workers=0)
    quarantine = tmp_path / "lake" / "quarantine" / "source=code" / "code-0002.parquet"
    quarantine.write_bytes(quarantine.read_bytes() + b"x")
    assert ingest_source(lake, "code", str(corpus), workers=0).shards_run == 1
    assert ingest_source(lake, "code", str(corpus), workers=0).shards_run == 0


def test_a_shard_whose_repeated_ids_moved_stays_done(tmp_path):
    """Moving repeated ids rewrites a shard's files after its record: the record follows."""
    corpus, lake = _corpus(tmp_path), Lake(tmp_path / "lake")
    (corpus / "code-0009.jsonl").write_text(json.dumps({"id": "0-1", "text": "again"}) + "\n")
    ingest_source(lake, "code", str(corpus), workers=0)
    assert ingest_source(lake, "code", str(corpus), workers=0).shards_run == 0
