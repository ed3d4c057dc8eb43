"""The shard ledger: a shard is ingested once; changed bytes, and only changed bytes, make it pending."""

import os

from moe_dag.engine.shard_ledger import ShardLedger, ShardRead, file_checksum, scan_shards


def read_now(location: str) -> list[ShardRead]:
    """The shards under `location` as a reader reading them now would record them."""
    return [ShardRead(f.path, f.size, f.mtime, file_checksum(f.path)) for f in scan_shards(location)]


def test_a_shard_is_pending_until_recorded_and_again_only_when_its_bytes_change(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "one.jsonl").write_text('{"id": "1", "text": "one"}\n')
    (shards / "two.jsonl").write_text('{"id": "2", "text": "two"}\n')
    ledger = ShardLedger(tmp_path / "ledger.duckdb")

    changes = ledger.changes("web", scan_shards(str(shards)))
    assert [s.path for s in changes.new] == [str(shards / "one.jsonl"), str(shards / "two.jsonl")]
    ledger.record("web", read_now(str(shards)), run_id="run-1")
    assert not ledger.changes("web", scan_shards(str(shards)))
    assert ledger.changes("code", scan_shards(str(shards))).new  # ledgers are per source

    [row, _] = ledger.rows("web")
    assert row["ingested_by"] == "run-1" and row["size"] == (shards / "one.jsonl").stat().st_size
    assert row["checksum"] == file_checksum(str(shards / "one.jsonl"))

    # Copied again with the same bytes (a new modification time): not ingested again.
    stat = (shards / "one.jsonl").stat()
    os.utime(shards / "one.jsonl", (stat.st_atime, stat.st_mtime + 100))
    assert not ledger.changes("web", scan_shards(str(shards)))

    (shards / "two.jsonl").write_text('{"id": "2", "text": "two, longer"}\n')
    (shards / "three.jsonl").write_text('{"id": "3", "text": "three"}\n')
    (shards / "one.jsonl").unlink()
    changes = ledger.changes("web", scan_shards(str(shards)))
    assert [s.path for s in changes.new] == [str(shards / "three.jsonl")]
    assert [s.path for s in changes.changed] == [str(shards / "two.jsonl")]
    assert changes.removed == [str(shards / "one.jsonl")]

    ledger.record("web", read_now(str(shards)), run_id="run-2")
    rows = {row["path"].rsplit("/", 1)[1]: row for row in ledger.rows("web")}
    assert sorted(rows) == ["three.jsonl", "two.jsonl"]
    assert (
        rows["two.jsonl"]["ingested_by"] == "run-2"
        and rows["two.jsonl"]["first_seen"] < rows["two.jsonl"]["ingested_at"]
    )
