"""Shard readers: the Dolma format, every quarantine case, broken streams and fsspec locations."""

import gzip
import json
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from moe_dag.storage.readers import ShardReadError, list_shards, read_shard, read_shard_batches, read_shards
from moe_dag.storage.schema import DOCUMENT_SCHEMA, QUARANTINE_SCHEMA

# The structure of a real line of Dolma's Common Crawl test data (allenai/dolma, Apache-2.0), text cut.
DOLMA_LINE = (
    '{"added":"2023-04-07T15:24:38.743534+00:00","created":"2020-03-29T09:04:10Z",'
    '"id":"http://100kinvesting.com/2016/11/28/first-teleconference-calls-invoice-factoring/",'
    '"metadata":{"bucket":"head","cc_segment":"crawl-data/CC-MAIN-2020-16/segments/1585370494064.21/wet/'
    'CC-MAIN-20200329074745-20200329104745-00210.warc.wet.gz","date_download":"2020-03-29T09:04:10Z",'
    '"digest":"sha1:DNJVF5QUTTJGEF56WA5VCYUVVD3OW7XL","language":"en","language_score":0.95,"length":569,'
    '"line_ids":[41,42,56,57,59],"nlines":5,"original_length":2734,"original_nlines":105,"perplexity":304.6,'
    '"provenance":"cc_en_head-0112.json.gz:1","source_domain":"100kinvesting.com",'
    '"title":"First Teleconference Calls for Invoice Factoring, and more. \\u2014 100K Investing, LLC.",'
    '"url":"http://100kinvesting.com/2016/11/28/first-teleconference-calls-invoice-factoring/"},'
    '"source":"common-crawl","text":"We will be starting to hold weekly teleconferences for businesses '
    "that may be interested in invoice factoring.\\nIf you're in or around any of these areas, check out "
    'the teleconference."}'
)


def _line(i: int) -> bytes:
    return json.dumps({"id": f"doc-{i}", "text": f"document number {i} " * 5}).encode() + b"\n"


def test_real_dolma_line_keeps_every_field(tmp_path):
    path = tmp_path / "cc_en_head-0000.json.gz"
    path.write_bytes(gzip.compress((DOLMA_LINE + "\n").encode()))
    result = read_shard(str(path), "cc")
    assert result.quarantine.num_rows == 0 and result.records_read == 1
    assert result.documents.schema == DOCUMENT_SCHEMA
    row = result.documents.to_pylist()[0]
    original = json.loads(DOLMA_LINE)
    assert row["id"] == "cc/" + original["id"] and row["text"] == original["text"]
    assert (row["source"], row["shard"], row["line"]) == ("cc", str(path), 1)
    assert (row["added"], row["created"]) == ("2023-04-07T15:24:38.743534+00:00", "2020-03-29T09:04:10Z")
    assert json.loads(row["metadata"]) == {**original["metadata"], "dolma_source": "common-crawl"}


def test_each_bad_line_is_quarantined_with_a_precise_error(tmp_path):
    lines = [
        _line(1),
        b'{"id": "a", "text": "x" "y"}\n',
        b'{"id": "b"}\n',
        b'{"id": "c", "text": 42}\n',
        b'{"id": "d", "text": "caf\xe9"}\n',
        b"[1, 2]\n",
        b'{"id": "e", "text": "t", "metadata": [1]}\n',
        b'{"id": "f", "text": "\\ud800"}\n',
        b'{"id": true, "text": "t"}\n',
        b"\n",  # blank: skipped, yet it still counts for the line numbers after it
        b'{"id": 7, "text": "an integer id", "version": "v3"}',  # last line without a newline
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join(lines))
    result = read_shard(str(path), "web")

    errors = {row["line"]: row["error"] for row in result.quarantine.to_pylist()}
    assert errors == {
        2: "invalid JSON: Expecting ',' delimiter at column 25",
        3: "missing field 'text'",
        4: "field 'text' is not a string",
        5: "invalid UTF-8 at byte 24",
        6: "record is not a JSON object (got list)",
        7: "field 'metadata' is not an object",
        8: "field 'text' holds an unpaired surrogate",
        9: "field 'id' is not a string or a number",
    }
    assert result.quarantine.schema == QUARANTINE_SCHEMA
    assert set(result.quarantine["source"].to_pylist()) == {"web"}
    assert result.quarantine.to_pylist()[0]["raw"] == lines[1].decode().strip()
    docs = result.documents.to_pylist()
    assert [(d["id"], d["line"]) for d in docs] == [("web/doc-1", 1), ("web/7", 11)]
    assert json.loads(docs[1]["metadata"]) == {"dolma_version": "v3"}
    assert docs[1]["added"] is None and docs[1]["created"] is None
    assert result.records_read == result.documents.num_rows + result.quarantine.num_rows == 10


def test_raw_line_is_truncated_to_1000_characters(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text('{"id": "x", "texte": "' + "a" * 5000 + '"}\n')
    row = read_shard(str(path), "web").quarantine.to_pylist()[0]
    assert row["error"] == "missing field 'text'" and len(row["raw"]) == 1000


def _assert_cut_after_some_lines(result, total: int) -> None:
    good = result.documents["line"].to_pylist()
    assert good == list(range(1, len(good) + 1)) and 10 <= len(good) < total
    [cut] = result.quarantine.to_pylist()
    assert cut["line"] == len(good) + 1 and cut["error"].startswith("truncated compressed stream")
    assert result.records_read == len(good) + 1


def test_truncated_gzip_keeps_the_lines_before_the_cut(tmp_path):
    first, second = b"".join(_line(i) for i in range(10)), b"".join(_line(i) for i in range(10, 20))
    data = gzip.compress(first, mtime=0) + gzip.compress(second, mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[:-30])
    _assert_cut_after_some_lines(read_shard(str(path), "web"), total=20)


def test_truncated_zstd_keeps_the_lines_before_the_cut(tmp_path):
    cctx = zstandard.ZstdCompressor()
    first, second = b"".join(_line(i) for i in range(10)), b"".join(_line(i) for i in range(10, 20))
    data = cctx.compress(first) + cctx.compress(second)
    complete, cut = tmp_path / "whole.jsonl.zst", tmp_path / "cut.jsonl.zst"
    complete.write_bytes(data)
    cut.write_bytes(data[:-10])
    whole = read_shard(str(complete), "web")
    assert whole.documents.num_rows == 20 and whole.quarantine.num_rows == 0  # both frames read
    _assert_cut_after_some_lines(read_shard(str(cut), "web"), total=20)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("absent.jsonl.gz", None, "does not exist"),
        ("plain.jsonl.gz", b'{"id": 1, "text": "not gzip"}\n', "not a valid gzip stream"),
        ("plain.jsonl.zst", b'{"id": 1, "text": "not zstd"}\n', "not a valid zstd stream"),
        ("broken.parquet", b"PAR1 but nothing else", "not a readable parquet file"),
    ],
)
def test_unopenable_shard_raises_naming_the_file(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ShardReadError, match=message) as error:
        read_shard(str(path), "web")
    assert str(path) in str(error.value) and isinstance(error.value, ValueError)


def test_parquet_shard_rows_become_documents(tmp_path):
    table = pa.table(
        {
            "id": [1, 2, 3],
            "text": ["first", None, "third"],
            "source": ["s3-dump"] * 3,
            "added": ["2024-01-01T00:00:00Z"] * 3,
            "metadata": ['{"lang": "en"}', "{}", '{"lang": "fr"}'],
        }
    )
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path)
    result = read_shard(str(path), "web")
    docs = result.documents.to_pylist()
    assert [(d["id"], d["line"], d["created"]) for d in docs] == [("web/1", 1, None), ("web/3", 3, None)]
    assert json.loads(docs[1]["metadata"]) == {"lang": "fr", "dolma_source": "s3-dump"}
    assert result.quarantine.select(["line", "error"]).to_pylist() == [
        {"line": 2, "error": "field 'text' is not a string"}
    ]


def test_list_shards_finds_every_format_recursively_and_sorted(tmp_path):
    names = ["b/x.jsonl.zst", "a.jsonl", "a.json.gz", "b/c/y.parquet", "z.json.zst", "w.jsonl.gz"]
    for name in names + ["notes.txt", "b/readme.md"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert list_shards(str(tmp_path)) == sorted(str(tmp_path / n) for n in names)
    assert list_shards(f"file://{tmp_path}") == list_shards(str(tmp_path))


def test_list_shards_rejects_a_missing_or_empty_location(tmp_path):
    with pytest.raises(ValueError, match="does not exist") as error:
        list_shards(str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(error.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no shard"):
        list_shards(str(tmp_path / "empty"))


def test_memory_filesystem_url_lists_and_reads(tmp_path):
    root = f"memory://corpus-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    try:
        with fs.open(f"{root}/web/0.jsonl.gz", "wb") as f:
            f.write(gzip.compress(_line(0) + _line(1)))
        with fs.open(f"{root}/web/1.jsonl", "wb") as f:
            f.write(_line(2) + b"{oops\n")
        shards = list_shards(f"{root}/web")
        assert [s.startswith("memory://") for s in shards] == [True, True]
        result = read_shards(shards, "web")
        assert result.documents["id"].to_pylist() == ["web/doc-0", "web/doc-1", "web/doc-2"]
        assert result.quarantine.select(["shard", "line"]).to_pylist() == [{"shard": shards[1], "line": 2}]
        assert result.records_read == 4
    finally:
        fs.rm(root.removeprefix("memory://"), recursive=True)


def test_read_shards_of_nothing_is_empty_with_the_schemas():
    result = read_shards([], "web")
    assert result.documents.schema == DOCUMENT_SCHEMA and result.documents.num_rows == 0
    assert result.quarantine.schema == QUARANTINE_SCHEMA and result.records_read == 0


def test_lone_cr_and_crlf_line_endings_split_records(tmp_path):
    """Old Mac files end lines with a lone CR: three records must not become one quarantine row."""
    records = [json.dumps({"id": f"r{i}", "text": f"record {i}"}).encode() for i in range(3)]
    for ending, name in ((b"\r", "cr.jsonl"), (b"\r\n", "crlf.jsonl")):
        path = tmp_path / name
        path.write_bytes(ending.join(records) + ending)
        result = read_shard(str(path), "web")
        assert result.quarantine.num_rows == 0, name
        assert result.documents.select(["id", "line"]).to_pylist() == [
            {"id": f"web/r{i}", "line": i + 1} for i in range(3)
        ]
        assert result.records_read == 3


def test_a_crlf_split_across_read_chunks_is_one_line_ending(tmp_path, monkeypatch):
    monkeypatch.setattr("moe_dag.storage.readers.CHUNK_BYTES", 7)
    path = tmp_path / "small-chunks.jsonl"
    path.write_bytes(b"".join(json.dumps({"id": i, "text": "t" * i}).encode() + b"\r\n" for i in range(1, 9)))
    result = read_shard(str(path), "web")
    assert result.quarantine.num_rows == 0
    assert result.documents["line"].to_pylist() == list(range(1, 9))


def test_a_leading_utf8_bom_is_stripped(tmp_path):
    path = tmp_path / "bom.jsonl.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + _line(0) + _line(1)))
    result = read_shard(str(path), "web")
    assert result.quarantine.num_rows == 0
    assert result.documents["id"].to_pylist() == ["web/doc-0", "web/doc-1"]


def test_records_run_together_on_one_line_are_each_quarantined(tmp_path):
    """Two records with the line break lost between them: the reconcile counts both."""
    path = tmp_path / "joined.jsonl"
    path.write_bytes(b'{"id": "a", "text": "one"}{"id": "b", "text": "two"}\n' + _line(3))
    result = read_shard(str(path), "web")
    rows = result.quarantine.select(["line", "error", "raw"]).to_pylist()
    assert [(row["line"], row["error"]) for row in rows] == [
        (1, "2 JSON records on one line (a lost line break?): record 1"),
        (1, "2 JSON records on one line (a lost line break?): record 2"),
    ]
    assert rows[1]["raw"] == '{"id": "b", "text": "two"}'
    assert result.records_read == 3 == result.documents.num_rows + result.quarantine.num_rows


def test_ids_are_namespaced_by_source(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_bytes(_line(0))
    assert read_shard(str(path), "cc").documents["id"].to_pylist() == ["cc/doc-0"]
    assert read_shard(str(path), "code").documents["id"].to_pylist() == ["code/doc-0"]


def test_batches_stream_a_shard_in_bounded_pieces(tmp_path):
    path = tmp_path / "many.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(_line(i) for i in range(25)) + b"{bad\n"))
    batches = list(read_shard_batches(str(path), "web", batch_rows=10))
    assert [b.documents.num_rows for b in batches] == [10, 10, 5]
    assert sum(b.quarantine.num_rows for b in batches) == 1
    whole = read_shard(str(path), "web")
    assert pa.concat_tables([b.documents for b in batches]).equals(whole.documents)
