"""Ingest of one large raw shard in blocks (issue 19): byte ranges of a JSON-lines shard, row groups of a
parquet one, each block its own task, joined into the very files and record an unsplit read writes."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from moe_dag.curation.ingest import INGEST, ingest_source
from moe_dag.engine import ShardInput, process_shard, raw_shard_inputs
from moe_dag.engine.blocks import BlockSizes
from moe_dag.engine.join import commit_blocks
from moe_dag.storage.lake import Lake
from moe_dag.storage.readers import ShardReadResult, read_block_batches, read_shard, shard_spans

STAGES = ("raw_documents", "quarantine")
TIMINGS = ("seconds", "nodes", "blocks")  # what may differ between a split and an unsplit run


def _line(i: int) -> bytes:
    # Multi-byte UTF-8 (2, 3 and 4 bytes a character), so that block boundaries fall inside characters.
    return json.dumps({"id": f"d{i}", "text": f"café 漢字 🙂 {i}"}, ensure_ascii=False).encode()


def tricky_shard(path: Path, lines: int = 6000) -> tuple[bytes, dict[str, int]]:
    """A JSON-lines shard with a BOM, LF, CRLF and lone-CR line ends, blank lines, bad lines and a last
    line without a line end; returns its bytes and where some of its parts begin."""
    body, marks = [b"\xef\xbb\xbf"], {}
    for i in range(lines):
        offset = sum(map(len, body))
        if i == lines // 2:
            marks["bad"] = offset
            body.append(b'{"id": "broken", "text": "never closed\r\n')
            continue
        if i == lines // 3:
            marks["crlf"] = offset + len(_line(i))  # the CR of this line's CRLF
            body.append(_line(i) + b"\r\n")
            continue
        if i == 2 * lines // 3:
            marks["utf8"] = offset + _line(i).index("漢".encode()) + 1  # inside a 3-byte character
        end = (b"\n", b"\r\n", b"\r", b"\n\n")[i % 4]
        body.append((b"\xff bad utf-8" if i % 997 == 5 else _line(i)) + end)
    body.append(_line(lines))  # no line end
    data = b"".join(body)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data, marks


def split_run(lake: Lake, shard: ShardInput, spans: list[tuple[int, int]]) -> dict:
    """Each block done on its own, then joined, in this process (the engine does it in Ray tasks)."""
    work, records = INGEST.make_work(), []
    for span in spans:
        result = process_shard(INGEST, work, lake, "web", dataclasses.replace(shard, span=span))
        assert "error" not in result, result
        records.append(result["record"])
    joined = commit_blocks(INGEST, lake, "web", shard, records)
    assert "error" not in joined, joined
    return joined["record"]


def assert_same_as_unsplit(tmp_path: Path, shard: ShardInput, split: Lake, record: dict) -> None:
    whole = Lake(tmp_path / "whole")
    unsplit = process_shard(INGEST, INGEST.make_work(), whole, "web", shard)["record"]
    for stage in STAGES:
        files = [Path(lake.shard_path(stage, "web", shard.key)).read_bytes() for lake in (split, whole)]
        assert files[0] == files[1], stage  # byte for byte: rows, line numbers, row groups
    assert {k: v for k, v in record.items() if k not in TIMINGS} == {
        k: v for k, v in unsplit.items() if k not in TIMINGS
    }
    for stage in STAGES:  # the blocks are gone
        assert not (Path(split.dataset_dir(stage, "web")) / "_blocks" / shard.key).exists()


def test_byte_range_blocks_join_into_the_unsplit_files_and_record(tmp_path):
    """Block boundaries inside a bad line, between the CR and LF of a CRLF, inside a UTF-8 character and
    at a lone CR; the last line has no line end."""
    path = tmp_path / "web" / "big.jsonl"
    data, marks = tricky_shard(path)
    cr = re.compile(rb"\r(?!\n)").search(data, len(data) // 6).start()  # a lone CR
    cuts = [0, cr + 1, marks["crlf"] + 1, marks["bad"] + 10, marks["utf8"], len(data)]
    assert cuts == sorted(cuts)
    [shard] = raw_shard_inputs([str(path)], str(path.parent))
    split = Lake(tmp_path / "split")
    record = split_run(split, shard, list(zip(cuts, cuts[1:], strict=False)))
    assert record["blocks"] == 5
    quarantine = pq.read_table(split.shard_path("quarantine", "web", shard.key))
    invalid = quarantine.filter(pc.starts_with(quarantine["error"], "invalid JSON"))
    assert "never closed" in invalid["raw"][0].as_py()
    assert_same_as_unsplit(tmp_path, shard, split, record)


def test_every_cut_of_a_small_shard_reads_its_lines_once(tmp_path):
    """Two blocks cut at every byte: the lines each owns, renumbered, are the whole shard's."""
    path = tmp_path / "small.jsonl"
    lines = ['{"id": 1, "text": "é"}', "\r{bad\n", '{"id": 2}', '{"id": 3, "text": "x"}\r']
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode())
    whole = read_shard(str(path), "web")
    size = path.stat().st_size
    for cut in range(size + 1):
        first, second = (read_block(path, span) for span in ((0, cut), (cut, size)))
        for name in ("documents", "quarantine"):
            rows = getattr(first, name).to_pylist()
            rows += [
                {**row, "line": row["line"] + first.read.lines} for row in getattr(second, name).to_pylist()
            ]
            assert rows == getattr(whole, name).to_pylist(), (cut, name)
        assert first.records_read + second.records_read == whole.records_read


def read_block(path: Path, span: tuple[int, int]) -> ShardReadResult:
    pieces = list(read_block_batches(str(path), "web", span))
    return ShardReadResult(
        documents=pa.concat_tables([piece.documents for piece in pieces]),
        quarantine=pa.concat_tables([piece.quarantine for piece in pieces]),
        records_read=sum(piece.records_read for piece in pieces),
        read=pieces[-1].read,
    )


def test_a_parquet_shard_splits_at_row_groups(tmp_path):
    path = tmp_path / "web" / "big.parquet"
    path.parent.mkdir()
    rows = [{"id": f"d{i}", "text": f"text {i}"} for i in range(5000)]
    rows[2500] = {"id": "x", "text": None}  # quarantined, with its row number
    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("text", pa.string())])) as writer:
        for start, size in ((0, 1500), (1500, 1500), (3000, 700), (3700, 1300)):
            writer.write_table(pa.Table.from_pylist(rows[start : start + size], schema=writer.schema))
    spans = shard_spans(str(path), 4, 1000, 1)
    assert spans == [(0, 1500), (1500, 3000), (3000, 5000)]  # whole row groups, 1250 rows or more
    [shard] = raw_shard_inputs([str(path)], str(path.parent))
    split = Lake(tmp_path / "split")
    record = split_run(split, shard, spans)
    assert pq.read_table(split.shard_path("quarantine", "web", shard.key))["line"].to_pylist() == [2501]
    assert_same_as_unsplit(tmp_path, shard, split, record)


def test_compressed_and_small_shards_stay_whole(tmp_path):
    data = b"".join(_line(i) + b"\n" for i in range(2000))
    (tmp_path / "a.jsonl").write_bytes(data)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(data))
    assert len(shard_spans(str(tmp_path / "a.jsonl"), 4, 1, len(data) // 4)) == 4
    assert shard_spans(str(tmp_path / "a.jsonl"), 4, 1, len(data) // 3) == [
        (0, len(data) // 3 + 1),
        (len(data) // 3 + 1, 2 * (len(data) // 3 + 1)),
        (2 * (len(data) // 3 + 1), len(data)),
    ]
    assert shard_spans(str(tmp_path / "a.jsonl"), 4, 1, len(data)) == []  # not two blocks' worth
    assert shard_spans(str(tmp_path / "a.jsonl.gz"), 4, 1, 1) == []  # a stream cannot be entered midway


def test_only_a_stage_with_idle_workers_splits(tmp_path):
    from moe_dag.engine.run import _work_items

    corpus, lake = tmp_path / "web", Lake(tmp_path / "lake")
    for name in ("a", "b"):
        tricky_shard(corpus / f"{name}.jsonl", lines=2000)
    shards = raw_shard_inputs([str(corpus / "a.jsonl"), str(corpus / "b.jsonl")], str(corpus))
    least = BlockSizes(rows=1, bytes=10_000)
    items, blocks, _ = _work_items(INGEST, lake, "web", shards, 2, least)
    assert (items, blocks) == (shards, {})  # a worker for each shard
    items, blocks, _ = _work_items(INGEST, lake, "web", shards, 4, least)
    assert [len(parts) for parts in blocks.values()] == [2, 2] and len(items) == 4
    _, blocks, _ = _work_items(INGEST, lake, "web", shards, 4, BlockSizes(rows=1, bytes=10**9))
    assert blocks == {}  # blocks under the least bytes


@pytest.mark.slow
def test_a_rerun_after_a_failed_block_redoes_only_that_block(tmp_path, local_ray):
    """On Ray with two workers the one shard runs as blocks; one block's record is lost (its task
    failed): the rerun redoes that block alone, joins, and equals the unsplit run."""
    corpus = tmp_path / "web"
    tricky_shard(corpus / "big.jsonl")
    [shard] = raw_shard_inputs([str(corpus / "big.jsonl")], str(corpus))
    split, size = Lake(tmp_path / "split"), (corpus / "big.jsonl").stat().st_size
    spans = INGEST.work_class.split(split, shard, 2, BlockSizes(rows=1, bytes=size // 4))
    work = INGEST.make_work()
    done = process_shard(INGEST, work, split, "web", spans[0])  # the block that finished before the crash
    assert "error" not in done

    run = ingest_source(split, "web", str(corpus), workers=2, min_block_rows=1, min_block_bytes=size // 4)
    assert run.documents_run == sum(
        process_shard(INGEST, work, Lake(tmp_path / "again"), "web", span)["record"]["counts"]["documents"]
        for span in spans[1:]
    )
    [record] = run.records.values()
    assert record["blocks"] == 2
    assert_same_as_unsplit(tmp_path, shard, split, record)
