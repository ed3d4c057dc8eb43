"""Read raw Dolma-format shards (JSON lines, gzip or zstd compressed, or parquet) into document tables.

A shard is read line by line from its bytes, so a bad line (invalid JSON, invalid UTF-8, a missing or
mistyped field) becomes one quarantine row naming the shard, the line and the error while every other
line is kept. Lines end at LF, CRLF or a lone CR (files from old Macs), as JSON can hold none of them
raw inside a record; a leading UTF-8 byte-order mark is dropped. A line that holds several whole JSON
records run together (a lost line break) becomes one quarantine row per record, so the records a
shard held are counted, not only its lines. A line nested too deeply for the JSON parser is one
quarantine row. A compressed stream that ends early keeps the lines decoded before the cut and adds
one quarantine row "truncated compressed stream" (with the byte of the file where it ends) at the line
after the last complete one. Only a shard that cannot be opened at all (missing, not the compression
its name says, not parquet) raises `ShardReadError`; an object store that refuses the credentials,
cannot be reached or stops replying raises `ObjectStoreError` (`moe_dag.storage.object_store`), naming
the endpoint and the fix. `decompressed_chunks` is the one way to the
bytes of a line-based shard, so the independent line count (`moe_dag.curation.counts`) sees what the
reader sees.

The bytes of the file are hashed as they are read (`ShardBytes`, on the last piece a shard yields), so
the shard ledger records what was ingested even when the file is replaced meanwhile.

Dolma fields map onto `DOCUMENT_SCHEMA`: the `source` column is the configured source name (the
partition key) and the document's own `source` moves into the metadata as `dolma_source`, as does any
other unknown top-level field (`dolma_<name>`), so nothing in a line is silently dropped. Blank lines
are skipped without a quarantine row but still count for line numbers.

Document ids are namespaced by source: the `id` column is `<source>/<id as in the shard>`, so two
sources may reuse an id (plausible with real Dolma shards) without colliding downstream. Ids repeated
within one source are quarantined after all its shards are read (`moe_dag.data.duplicate_ids`).

`read_shard_batches` streams a shard in pieces of a bounded number of documents, so a stage never holds
a whole shard; `read_shard` and `read_shards` concatenate them for tests and small inputs.

A large shard can also be read in blocks, each on its own (`shard_spans`, `read_block_batches`), so
that one shard keeps several workers busy (the engine's blocks, `moe_dag.engine.blocks`):

- an uncompressed JSON-lines shard by byte ranges: a block owns the lines that *start* in its range,
  so it begins at the first line start at or after its first byte and reads on past its last byte to
  the end of its last line (line ends as above: a CRLF is never cut, a BOM is dropped only at byte 0);
- a parquet shard by row groups: a block owns whole row groups;
- a compressed shard (gzip, zstd) cannot be entered in the middle of its stream: it is never split.

A block numbers its lines from 1 and says how many line numbers it used (`BlockRead.lines`, the
line ends in its bytes or its rows), so that the join can renumber them through the shard without
any block reading the bytes before its own. The whole file's checksum for the ledger is taken when
the blocks are joined (`joined_read`), which also checks that every block read the same file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import hashlib
import itertools
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from tqdm.auto import tqdm

from moe_dag.storage.object_store import object_store_errors
from moe_dag.storage.schema import DOCUMENT_SCHEMA, QUARANTINE_SCHEMA

SHARD_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".parquet")
DOLMA_FIELDS = ("id", "text", "source", "added", "created", "metadata")
MAX_RAW_CHARS = 1000
CHUNK_BYTES = 1 << 20
BATCH_ROWS = 2048
UTF8_BOM = b"\xef\xbb\xbf"
LINE_END = re.compile(rb"\r\n|\r|\n")


class ShardReadError(ValueError):
    """A shard that cannot be opened or decoded at all."""


class StreamCut(Exception):
    """The compressed stream broke after some data was decoded; the message is the quarantine error."""


class _RowError(ValueError):
    """One line that cannot become a document; the message is the quarantine error."""


@dataclass(frozen=True)
class ShardBytes:
    """The file a shard was read from, as read: its size, blake2b (as `file_checksum`) and mtime."""

    size: int
    checksum: str
    mtime: float | None


@dataclass(frozen=True)
class BlockRead:
    """What one block of a shard saw: the file's size and mtime when it opened it, and how many line
    numbers its lines took (the next block's lines are numbered on from there)."""

    size: int
    mtime: float | None
    lines: int


@dataclass
class ShardReadResult:
    documents: pa.Table  # DOCUMENT_SCHEMA
    quarantine: pa.Table  # QUARANTINE_SCHEMA
    # Records met, counted apart from the tables: one per non-blank line (parquet row) or per whole
    # JSON record on a line holding several, plus one for the cut record of a truncated stream. A reader
    # that lost a row would break documents + quarantine == this.
    records_read: int
    # On the last piece: the bytes the shard was read from, or what a block of it saw.
    read: ShardBytes | BlockRead | None = None


def new_checksum() -> Any:
    """The hash of a shard's bytes, shared by the reader and the shard ledger."""
    return hashlib.blake2b(digest_size=16)


class _HashingReader:
    """A binary file that hashes and counts the bytes read through it, in order."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.digest, self.offset = raw, new_checksum(), 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        self.offset += len(data)
        return data

    def tell(self) -> int:
        return self.offset

    def bytes_read(self, mtime: float | None) -> ShardBytes:
        return ShardBytes(self.offset, self.digest.hexdigest(), mtime)


def list_shards(location: str) -> list[str]:
    """Sorted shard paths under `location` (a folder or an fsspec URL), searched recursively."""
    with object_store_errors(location, "list the shards under"):
        fs, root = fsspec.core.url_to_fs(location)
        if not fs.exists(root):
            raise ValueError(f"shard location {location!r} does not exist")
        found = [root] if fs.isfile(root) else fs.find(root)
    shards = sorted(p for p in found if p.endswith(SHARD_SUFFIXES))
    if not shards:
        raise ValueError(f"shard location {location!r} holds no shard ({', '.join(SHARD_SUFFIXES)})")
    # Local paths stay plain; other filesystems need their protocol back for fsspec.open to find them.
    if "file" in _protocols(fs):
        return shards
    return [fs.unstrip_protocol(p) for p in shards]


def read_shards(paths: Sequence[str], source: str) -> ShardReadResult:
    """Read several shards of one source and concatenate their documents and quarantine rows."""
    results = [read_shard(p, source) for p in tqdm(paths, desc=f"read {source}", unit="shard", disable=None)]
    return _concat(results)


def read_shard(path: str, source: str) -> ShardReadResult:
    """Read one shard; bad rows go to quarantine, an unopenable shard raises `ShardReadError`."""
    return _concat(list(read_shard_batches(path, source)))


def read_shard_batches(path: str, source: str, batch_rows: int = BATCH_ROWS) -> Iterator[ShardReadResult]:
    """One shard as pieces of at most `batch_rows` documents (plus the quarantine rows met meanwhile);
    the last piece carries the `ShardBytes` it was read from."""
    builder = _TableBuilder(shard=path, source=source)
    with _opened(path) as (opened, info):
        raw = _HashingReader(opened)
        if path.endswith(".parquet"):
            _read_to_end(raw)  # hashed whole, then read at random
            opened.seek(0)
            pieces = _read_parquet(opened, path, builder)
        else:
            pieces = _read_json_lines(decompressed_chunks(raw, path), builder)
        yield from _flushed(pieces, builder, batch_rows)
        read = raw.bytes_read(_mtime(info))
    yield builder.flush(read)


def read_block_batches(
    path: str, source: str, span: tuple[int, int], batch_rows: int = BATCH_ROWS
) -> Iterator[ShardReadResult]:
    """One block of a shard (a span of `shard_spans`), read as `read_shard_batches` reads the whole: the
    lines that start in bytes [start, stop) of a JSON-lines shard, or the row groups that start in rows
    [start, stop) of a parquet shard. Lines are numbered from 1 within the block; the last piece carries
    the block's `BlockRead`."""
    builder = _TableBuilder(shard=path, source=source)
    with _opened(path) as (opened, info):
        if path.endswith(".parquet"):
            yield from _flushed(_read_parquet(opened, path, builder, span), builder, batch_rows)
            lines = builder.last_line
        elif _seekable(path):
            first, end = _line_start(opened, span[0]), _line_start(opened, span[1])
            chunks = _byte_range(opened, first, end)
            # Only the shard's first line can begin with the BOM that is dropped.
            pieces = _read_json_lines(_without_bom(chunks) if first == 0 else chunks, builder)
            yield from _flushed(pieces, builder, batch_rows)
            lines = builder.last_line - 1  # the line after the block's last line end is the next block's
        else:
            raise ShardReadError(f"shard {path!r} is compressed: it can only be read from its start")
        read = BlockRead(size=int(info["size"]), mtime=_mtime(info), lines=lines)
    yield builder.flush(read)


@contextlib.contextmanager
def _opened(path: str) -> Iterator[tuple[IO[bytes], dict[str, Any]]]:
    """The shard's file opened for reading, with its `info` (size, modification time) as it was
    opened; `ShardReadError` when it cannot be opened or read, `ObjectStoreError` when its object
    store refuses the credentials, cannot be reached or times out (the shard may be fine)."""
    try:
        with object_store_errors(path, "read the shard"):
            fs, bare = fsspec.core.url_to_fs(path)
            info = fs.info(bare)
            with fs.open(bare, "rb") as opened:
                yield opened, info
    except FileNotFoundError as e:
        raise ShardReadError(f"shard {path!r} does not exist") from e
    except OSError as e:
        raise ShardReadError(f"shard {path!r} cannot be read: {e}") from e


def _flushed(pieces: Iterator[None], builder: _TableBuilder, batch_rows: int) -> Iterator[ShardReadResult]:
    for _ in pieces:
        if builder.pending_rows >= batch_rows:
            yield builder.flush()


def _read_to_end(raw: IO[bytes]) -> None:
    for _ in iter(lambda: raw.read(CHUNK_BYTES), b""):
        pass


def _seekable(path: str) -> bool:
    """Whether a line-based shard's bytes are its lines, so that it can be entered at any byte."""
    return path.endswith(".jsonl")


def shard_spans(path: str, blocks: int, min_rows: int, min_bytes: int) -> list[tuple[int, int]]:
    """At most `blocks` spans that read shard `path` in blocks (`read_block_batches`), or [] when it
    stays whole: even byte ranges of a JSON-lines shard, none under `min_bytes`; row ranges of a
    parquet shard in whole row groups, each at least an even share and none under `min_rows`; never
    a compressed shard."""
    fs, bare = fsspec.core.url_to_fs(path)
    if path.endswith(".parquet"):
        with fs.open(bare, "rb") as handle:
            metadata = pq.ParquetFile(handle).metadata
        groups = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
        return _row_group_spans(groups, min(blocks, sum(groups) // min_rows), min_rows)
    if not _seekable(path):
        return []
    size = int(fs.info(bare)["size"])
    count = min(blocks, size // min_bytes)
    if count < 2:
        return []
    step = math.ceil(size / count)
    return [(start, min(start + step, size)) for start in range(0, size, step)]


def _row_group_spans(groups: list[int], count: int, min_rows: int) -> list[tuple[int, int]]:
    """Row ranges over whole row groups (of `groups` rows each): each closes at the first group end
    past an even share of the rows, and a last one under `min_rows` joins the one before."""
    if count < 2:
        return []
    total, spans, start, position = sum(groups), [], 0, 0
    for rows in groups:
        position += rows
        if position - start >= total / count:
            spans.append((start, position))
            start = position
    if start < total:
        if spans and total - start < min_rows:
            spans[-1] = (spans[-1][0], total)
        else:
            spans.append((start, total))
    return spans if len(spans) > 1 else []


def joined_read(path: str, reads: list[dict[str, Any]]) -> ShardBytes:
    """The `ShardBytes` of a shard read in blocks (`reads`: their `BlockRead`s, as dicts): the file
    hashed now, once it is clear every block read this very file (its size and mtime); else the shard
    changed while its blocks were read, and they may hold different versions of it."""
    with _opened(path) as (opened, info):
        raw = _HashingReader(opened)
        _read_to_end(raw)
        read = raw.bytes_read(_mtime(info))
    seen = {(block["size"], block["mtime"]) for block in reads}
    if seen != {(read.size, read.mtime)}:
        raise ShardReadError(f"shard {path!r} changed while its blocks were read; read it again")
    return read


def _line_start(handle: IO[bytes], offset: int) -> int:
    """The first byte at or after `offset` where a line starts (the end of the file when none does)."""
    if offset <= 0:
        return 0
    handle.seek(offset - 1)
    base, data = offset - 1, b""
    while True:
        chunk = handle.read(CHUNK_BYTES)
        data += chunk
        # Searching from the byte before `offset`, the first line end found ends at `offset` or later.
        end = LINE_END.search(data)
        if end is not None and (end.group() != b"\r" or end.end() < len(data) or not chunk):
            return base + end.end()
        if not chunk:
            return base + len(data)
        keep = data[-1:] if data.endswith(b"\r") else b""  # a CR that may be the first half of a CRLF
        base, data = base + len(data) - len(keep), keep


def _byte_range(handle: IO[bytes], start: int, stop: int) -> Iterator[bytes]:
    handle.seek(start)
    position = start
    while position < stop:
        chunk = handle.read(min(CHUNK_BYTES, stop - position))
        if not chunk:
            return
        position += len(chunk)
        yield chunk


def _mtime(info: dict[str, Any]) -> float | None:
    changed = info.get("mtime") or info.get("LastModified") or info.get("created")
    if isinstance(changed, dt.datetime):
        return changed.timestamp()
    return float(changed) if changed is not None else None


def _concat(results: list[ShardReadResult]) -> ShardReadResult:
    return ShardReadResult(
        documents=pa.concat_tables([DOCUMENT_SCHEMA.empty_table()] + [r.documents for r in results]),
        quarantine=pa.concat_tables([QUARANTINE_SCHEMA.empty_table()] + [r.quarantine for r in results]),
        records_read=sum(r.records_read for r in results),
    )


def _read_json_lines(chunks: Iterator[bytes], builder: _TableBuilder) -> Iterator[None]:
    """Feed every line of `chunks` to `builder`, yielding after each line so the caller can flush a
    batch."""
    line_no = 0
    pending = b""
    try:
        for chunk in chunks:
            lines = LINE_END.split(pending + chunk)
            pending = lines.pop()
            if chunk.endswith(b"\r"):
                # The CR may be the first half of a CRLF that the next chunk completes.
                pending = lines.pop() + b"\r"
            for line in lines:
                line_no += 1
                builder.add_json_line(line_no, line)
                yield
    except StreamCut as e:
        # The bytes after the last line end are what survived of the cut record.
        builder.add_cut_record(line_no + 1, str(e), pending)
        return
    for line in LINE_END.split(pending):
        line_no += 1
        builder.add_json_line(line_no, line)
        yield


def decompressed_chunks(raw: IO[bytes], path: str) -> Iterator[bytes]:
    """The decompressed bytes of a line-based shard without a leading BOM; `StreamCut` when a
    compressed stream ends early or breaks after some data was decoded."""
    return _without_bom(_decompressed_chunks(raw, path))


def _without_bom(chunks: Iterator[bytes]) -> Iterator[bytes]:
    head: bytes | None = b""  # the stream's first bytes until they show whether a BOM starts it
    for chunk in chunks:
        if head is None:
            yield chunk
            continue
        head += chunk
        if len(head) < len(UTF8_BOM) and UTF8_BOM.startswith(head):
            continue
        yield head.removeprefix(UTF8_BOM)
        head = None
    if head:
        yield head


def _decompressed_chunks(raw: IO[bytes], path: str) -> Iterator[bytes]:
    if path.endswith(".gz"):
        yield from _gzip_chunks(raw, path)
    elif path.endswith(".zst"):
        yield from _zstd_chunks(raw, path)
    else:
        yield from iter(lambda: raw.read(CHUNK_BYTES), b"")


def _truncated(raw: IO[bytes]) -> StreamCut:
    return StreamCut(f"truncated compressed stream: the file ends at byte {raw.tell()}, inside a frame")


def _gzip_chunks(raw: IO[bytes], path: str) -> Iterator[bytes]:
    stream = gzip.GzipFile(fileobj=raw, mode="rb")
    decoded_any = False
    while True:
        try:
            chunk = stream.read1(CHUNK_BYTES)  # read() would drop what it decoded before a failure
        except EOFError as e:
            raise _truncated(raw) from e
        except (gzip.BadGzipFile, zlib.error) as e:
            if not decoded_any:
                raise ShardReadError(f"shard {path!r} is not a valid gzip stream: {e}") from e
            raise StreamCut(f"corrupt compressed stream at byte {raw.tell()}: {e}") from e
        if not chunk:
            return
        decoded_any = True
        yield chunk


def _zstd_chunks(raw: IO[bytes], path: str) -> Iterator[bytes]:
    # A stream reader returns a silent EOF on a cut frame; a decompressobj exposes `eof`, so a frame
    # that ran out of input is seen. A shard may hold several concatenated frames.
    dctx = zstandard.ZstdDecompressor()
    frame = dctx.decompressobj()
    frame_started = decoded_any = False
    for data in iter(lambda: raw.read(CHUNK_BYTES), b""):
        while data:
            frame_started = True
            try:
                out = frame.decompress(data)
            except zstandard.ZstdError as e:
                if not decoded_any:
                    raise ShardReadError(f"shard {path!r} is not a valid zstd stream: {e}") from e
                raise StreamCut(f"corrupt compressed stream at byte {raw.tell()}: {e}") from e
            if out:
                decoded_any = True
                yield out
            data = b""
            if frame.eof:
                data = frame.unused_data
                frame = dctx.decompressobj()
                frame_started = False
    if frame_started:
        raise _truncated(raw)


def _read_parquet(
    raw: IO[bytes], path: str, builder: _TableBuilder, rows: tuple[int, int] | None = None
) -> Iterator[None]:
    """Feed every row to `builder` (with `rows`, those of the row groups that start in [start, stop))."""
    try:
        parquet = pq.ParquetFile(raw)
    except (pa.ArrowException, OSError) as e:
        raise ShardReadError(f"shard {path!r} is not a readable parquet file: {e}") from e
    missing = [f for f in ("id", "text") if f not in parquet.schema_arrow.names]
    if missing:
        raise ShardReadError(f"parquet shard {path!r} has no column {missing[0]!r}")
    groups = None
    if rows is not None:
        sizes = [parquet.metadata.row_group(index).num_rows for index in range(parquet.num_row_groups)]
        firsts = list(itertools.accumulate(sizes, initial=0))[:-1]
        groups = [index for index, first in enumerate(firsts) if rows[0] <= first < rows[1]]
    row_no = 0
    for batch in parquet.iter_batches(row_groups=groups):
        for record in batch.to_pylist():
            row_no += 1
            builder.add_record(row_no, record, raw=lambda r=record: json.dumps(r, default=str))
            yield


class _TableBuilder:
    """Accumulates document and quarantine columns for one shard."""

    def __init__(self, *, shard: str, source: str) -> None:
        self.shard, self.source = shard, source
        self.docs: dict[str, list[Any]] = {name: [] for name in DOCUMENT_SCHEMA.names}
        self.errors: dict[str, list[Any]] = {name: [] for name in QUARANTINE_SCHEMA.names}
        self.records_read = 0
        self.last_line = 0  # the number of the last line (row) met

    def add_json_line(self, line_no: int, line: bytes) -> None:
        self.last_line = line_no
        if not line.strip():
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            self.records_read += 1
            self._quarantine(line_no, f"invalid UTF-8 at byte {e.start}", line)
            return
        try:
            record = json.loads(text)
        except RecursionError:
            self.records_read += 1
            self._quarantine(line_no, "JSON nested too deeply to parse", line)
            return
        except json.JSONDecodeError as e:
            run_together = _whole_records(text) if e.msg == "Extra data" else []
            if len(run_together) > 1:
                self._quarantine_run_together(line_no, run_together)
                return
            self.records_read += 1
            self._quarantine(line_no, f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}", line)
            return
        self.add_record(line_no, record, raw=lambda: text)

    def add_record(self, line_no: int, record: Any, raw: Callable[[], str]) -> None:
        """One decoded record; `raw` renders it for the quarantine only when it is rejected."""
        self.last_line = line_no
        self.records_read += 1
        try:
            row = _document_row(record, self.source)
        except _RowError as e:
            self._quarantine(line_no, str(e), raw())
            return
        except RecursionError:  # parsed, but nested too deeply to serialise again
            self._quarantine(line_no, "JSON nested too deeply to store", raw())
            return
        row.update(source=self.source, shard=self.shard, line=line_no)
        for name, value in row.items():
            self.docs[name].append(value)

    def add_cut_record(self, line_no: int, error: str, partial: bytes) -> None:
        self.records_read += 1
        self._quarantine(line_no, error, partial)

    def _quarantine_run_together(self, line_no: int, records: list[str]) -> None:
        for number, text in enumerate(records, start=1):
            self.records_read += 1
            error = f"{len(records)} JSON records on one line (a lost line break?): record {number}"
            self._quarantine(line_no, error, text)

    def _quarantine(self, line_no: int, error: str, raw: bytes | str) -> None:
        if isinstance(raw, bytes):
            raw = raw[: 4 * MAX_RAW_CHARS].decode("utf-8", errors="replace")
        raw = raw[:MAX_RAW_CHARS].encode("utf-8", errors="replace").decode("utf-8")  # drops lone surrogates
        row = {"source": self.source, "shard": self.shard, "line": line_no, "error": error, "raw": raw}
        for name, value in row.items():
            self.errors[name].append(value)

    @property
    def pending_rows(self) -> int:
        return len(self.docs["id"]) + len(self.errors["line"])

    def flush(self, read: ShardBytes | None = None) -> ShardReadResult:
        """The rows gathered since the last flush (`read`: the shard's bytes, on its last piece)."""
        result = ShardReadResult(
            documents=pa.table(self.docs, schema=DOCUMENT_SCHEMA),
            quarantine=pa.table(self.errors, schema=QUARANTINE_SCHEMA),
            records_read=self.records_read,
            read=read,
        )
        self.docs = {name: [] for name in DOCUMENT_SCHEMA.names}
        self.errors = {name: [] for name in QUARANTINE_SCHEMA.names}
        self.records_read = 0
        return result


def _whole_records(text: str) -> list[str]:
    """The JSON values a line holds one after another, or [] when it is not wholly made of them."""
    decoder = json.JSONDecoder()
    found, position = [], len(text) - len(text.lstrip())
    while position < len(text):
        try:
            _, end = decoder.raw_decode(text, position)
        except (json.JSONDecodeError, RecursionError):
            return []
        found.append(text[position:end])
        position = len(text) - len(text[end:].lstrip())
    return found


def _document_row(record: Any, source: str) -> dict[str, Any]:
    """Map one Dolma record onto the document columns it fills itself, or raise `_RowError`."""
    if not isinstance(record, dict):
        raise _RowError(f"record is not a JSON object (got {type(record).__name__})")
    for name in ("id", "text"):
        if name not in record:
            raise _RowError(f"missing field {name!r}")
    doc_id, text = record["id"], record["text"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int | float):
        raise _RowError("field 'id' is not a string or a number")
    if not isinstance(text, str):
        raise _RowError("field 'text' is not a string")
    metadata = record.get("metadata")
    if isinstance(metadata, str):  # parquet shards may carry metadata already serialised
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError as e:
            raise _RowError(f"field 'metadata' holds invalid JSON: {e.msg} at column {e.colno}") from e
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise _RowError("field 'metadata' is not an object")
    metadata = dict(metadata)
    for name, value in record.items():
        if name not in DOLMA_FIELDS or name == "source":
            metadata[f"dolma_{name}"] = value
    row = {
        "id": f"{source}/{doc_id}",
        "text": text,
        "added": _timestamp(record.get("added")),
        "created": _timestamp(record.get("created")),
        "metadata": json.dumps(metadata, sort_keys=True, ensure_ascii=False, default=str),
    }
    for name, value in row.items():
        # json.loads accepts lone surrogates ("\ud800") that no UTF-8 column can hold.
        if isinstance(value, str) and not _encodable(value):
            raise _RowError(f"field {name!r} holds an unpaired surrogate")
    return row


def _timestamp(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
