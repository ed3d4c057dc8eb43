"""Issue 23, items 5, 6 and 7: the ledger keeps what ingest read, not the file as it is afterwards; the
independent line count agrees with the reader (a BOM before a blank line, a truncated zstd shard); a
line nested too deeply for the JSON parser is quarantined alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import zstandard

from moe_dag.curation import work
from moe_dag.curation.counts import count_shard_lines, unreconciled_shards
from moe_dag.curation.ingest import ingest_source
from moe_dag.engine.shard_ledger import ShardLedger, scan_shards, shards_read
from moe_dag.storage.lake import Lake
from moe_dag.storage.readers import read_shard


def _lines(count: int, start: int = 0) -> str:
    return "".join(json.dumps({"id": i, "text": f"document {i}"}) + "\n" for i in range(start, start + count))


def test_a_shard_replaced_while_it_is_ingested_is_ingested_again(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shard = corpus / "a.jsonl"
    shard.write_text(_lines(300))
    real_reader = work.read_shard_batches

    def replaced_after_the_first_batch(path, source, batch_rows=100):
        for number, piece in enumerate(real_reader(path, source, batch_rows=100)):
            if number == 0:  # a new version lands while the old one is read, as a copy-and-rename does
                (corpus / "a.jsonl.new").write_text(_lines(400))
                os.replace(corpus / "a.jsonl.new", shard)
            yield piece

    monkeypatch.setattr(work, "read_shard_batches", replaced_after_the_first_batch)
    lake, ledger = Lake(tmp_path / "lake"), ShardLedger(tmp_path / "ledger.duckdb")
    run = ingest_source(lake, "web", str(corpus), workers=0)
    assert run.counts["kept"] == 300
    ledger.record("web", shards_read(run.records), "run-1")

    changes = ledger.changes("web", scan_shards(str(corpus)))
    assert [shard.path for shard in changes.changed] == [str(shard)]  # the sensor and `moe-dag run` see it
    monkeypatch.setattr(work, "read_shard_batches", real_reader)
    again = ingest_source(lake, "web", str(corpus), workers=0)
    assert again.counts["kept"] == 400
    ledger.record("web", shards_read(again.records), "run-2")
    assert not ledger.changes("web", scan_shards(str(corpus)))


def test_the_ledger_checksum_is_that_of_the_bytes_read(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text(_lines(5))
    run = ingest_source(Lake(tmp_path / "lake"), "web", str(corpus), workers=0)
    [read] = shards_read(run.records)
    assert read.size == (corpus / "a.jsonl").stat().st_size
    ledger = ShardLedger(tmp_path / "ledger.duckdb")
    ledger.record("web", [read], "run-1")
    assert not ledger.changes("web", scan_shards(str(corpus)))


def _agree(path: Path) -> tuple[int, int]:
    result = read_shard(str(path), "web")
    return count_shard_lines(str(path)), len(
        set(result.documents["line"].to_pylist() + result.quarantine["line"].to_pylist())
    )


def test_a_bom_before_a_blank_line_counts_as_the_reader_reads(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf\n{"id":1,"text":"a b"}\n')
    assert _agree(path) == (1, 1)


def test_a_truncated_zstd_shard_counts_its_cut_record_and_names_the_offset(tmp_path):
    whole = zstandard.ZstdCompressor().compress(_lines(1).encode())
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(whole[: len(whole) - 6])
    assert _agree(path) == (1, 1)
    [error] = read_shard(str(path), "web").quarantine["error"].to_pylist()
    assert "truncated compressed stream" in error and f"byte {len(whole) - 6}" in error


def test_a_truncated_zstd_shard_reconciles_in_the_lake(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    whole = zstandard.ZstdCompressor().compress(_lines(50).encode())
    (corpus / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    lake = Lake(tmp_path / "lake")
    ingest_source(lake, "web", str(corpus), workers=0)
    assert unreconciled_shards(lake, "web", str(corpus), workers=1) == []


def test_a_deeply_nested_line_is_quarantined_alone(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = "[" * 200_000 + "]" * 200_000
    nested_object = '{"id": 3, "text": "t", "metadata": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001
    path.write_text(_lines(2) + deep + "\n" + nested_object + "\n" + _lines(1, start=9))
    result = read_shard(str(path), "web")
    assert result.documents["line"].to_pylist() == [1, 2, 5]
    errors = dict(
        zip(result.quarantine["line"].to_pylist(), result.quarantine["error"].to_pylist(), strict=True)
    )
    assert set(errors) == {3, 4} and all("nested too deeply" in error for error in errors.values())
    assert count_shard_lines(str(path)) == 5
