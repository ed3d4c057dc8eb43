"""The shard ledger: which raw shard files have been ingested, so that each is ingested once.

A DuckDB table (`shard_ledger.duckdb` beside the catalog: the catalog file is locked while
`document_catalog` rebuilds it, the ledger must stay writable by per-source runs):

    source, path, size, mtime, checksum, first_seen, ingested_by (run id), ingested_at

A shard is *pending* when its path is not in the ledger, or when its size or modification time differ
from the ledger's and its checksum (blake2b of the bytes, streamed) differs too: a shard copied again
with the same bytes is not ingested again. The ledger holds the shard as ingest read it (size, mtime
and checksum taken by the reader while reading, kept in the completion record), never the file as it is
afterwards: a shard replaced during ingest differs from its entry, so it is ingested again. A path in
the ledger whose file is gone is *removed*: its source has changed as well (ingest drops its rows).
Finding pending shards reads only file listings and sizes; checksums are computed for changed files
only, in Ray tasks where the process is connected to Ray (the readers hash what ingest reads, in its
tasks), never by a pass over the bytes in the Dagster process.

Writers take the database for a moment; DuckDB allows one process at a time, so opening waits (up to
`LOCK_WAIT_S`) while another holds it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import fsspec

from moe_dag.engine.tasks import map_tasks
from moe_dag.storage.readers import CHUNK_BYTES, list_shards, new_checksum

LEDGER_FILE = "shard_ledger.duckdb"
LOCK_WAIT_S = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS shard_ledger (
    source VARCHAR NOT NULL,
    path VARCHAR NOT NULL,
    size BIGINT NOT NULL,
    mtime DOUBLE,
    checksum VARCHAR NOT NULL,
    first_seen TIMESTAMP NOT NULL,
    ingested_by VARCHAR NOT NULL,
    ingested_at TIMESTAMP NOT NULL,
    PRIMARY KEY (source, path)
)
"""


@dataclass(frozen=True)
class ShardFile:
    path: str
    size: int
    mtime: float | None


@dataclass(frozen=True)
class ShardRead:
    """A shard as ingest read it."""

    path: str
    size: int
    mtime: float | None
    checksum: str


def shards_read(records: dict[str, dict]) -> list[ShardRead]:
    """The shards behind `raw_documents` completion records, as they were read. A record written before
    readers hashed what they read vouches for the file as it is now (hashed in Ray tasks)."""
    unhashed = scan_files([record["input"] for record in records.values() if "read" not in record])
    checksums = map_tasks(file_checksum, [file.path for file in unhashed])
    now = {
        file.path: ShardRead(file.path, file.size, file.mtime, c)
        for file, c in zip(unhashed, checksums, strict=True)
    }
    read = []
    for record in records.values():
        facts = record.get("read")
        if facts is None:
            read.append(now[record["input"]])
        else:
            read.append(ShardRead(record["input"], facts["size"], facts["mtime"], facts["checksum"]))
    return read


@dataclass(frozen=True)
class LedgerChanges:
    """How a source's shard location differs from what the ledger says was ingested."""

    new: list[ShardFile]
    changed: list[ShardFile]
    removed: list[str]

    @property
    def pending(self) -> list[ShardFile]:
        return [*self.new, *self.changed]

    def __bool__(self) -> bool:
        return bool(self.new or self.changed or self.removed)

    def describe(self) -> str:
        return f"{len(self.new)} new, {len(self.changed)} changed, {len(self.removed)} removed shards"


def ledger_path(catalog_path: str | Path) -> Path:
    """Where the ledger of the pipeline whose catalog is `catalog_path` lives."""
    return Path(catalog_path).parent / LEDGER_FILE


def scan_shards(location: str) -> list[ShardFile]:
    """The shard files under `location` (the source's `shards`), with their sizes and modification times."""
    return scan_files(list_shards(location))


def scan_files(paths: list[str]) -> list[ShardFile]:
    files = []
    for path in paths:
        fs, bare = fsspec.core.url_to_fs(path)
        info = fs.info(bare)
        mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
        files.append(ShardFile(path, int(info["size"]), _seconds(mtime)))
    return files


def file_checksum(path: str) -> str:
    """blake2b of the file's bytes, read in 1 MiB chunks: no file is held in memory."""
    digest = new_checksum()
    with fsspec.open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class ShardLedger:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def changes(self, source: str, shards: list[ShardFile]) -> LedgerChanges:
        """Shards of `source` not ingested yet (new or changed), and ledger entries whose file is gone."""
        known = {row["path"]: row for row in self.rows(source)}
        new = [shard for shard in shards if shard.path not in known]
        touched = [
            shard
            for shard in shards
            if shard.path in known
            and (shard.size, shard.mtime) != (known[shard.path]["size"], known[shard.path]["mtime"])
        ]
        checksums = map_tasks(file_checksum, [shard.path for shard in touched])
        changed = [
            shard
            for shard, checksum in zip(touched, checksums, strict=True)
            if checksum != known[shard.path]["checksum"]
        ]
        present = {shard.path for shard in shards}
        return LedgerChanges(new, changed, sorted(set(known) - present))

    def record(self, source: str, read: list[ShardRead], run_id: str) -> LedgerChanges:
        """After `run_id` ingested exactly the shards `read` for `source`, as they were read: enter the
        new and changed ones (a changed shard keeps its first_seen) and forget the ones that are gone.
        Returns what changed."""
        known = {row["path"]: row for row in self.rows(source)}
        as_files = [ShardFile(shard.path, shard.size, shard.mtime) for shard in read]
        changes = LedgerChanges(
            new=[file for file in as_files if file.path not in known],
            changed=[
                file
                for file, shard in zip(as_files, read, strict=True)
                if file.path in known and shard.checksum != known[file.path]["checksum"]
            ],
            removed=sorted(set(known) - {shard.path for shard in read}),
        )
        now = datetime.now(UTC).replace(tzinfo=None)
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            for path in changes.removed:
                con.execute("DELETE FROM shard_ledger WHERE source = ? AND path = ?", [source, path])
            for shard in read:
                # A shard read again with the same bytes keeps its entry, with the size and time read.
                con.execute(
                    """
                    INSERT INTO shard_ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (source, path) DO UPDATE SET size = excluded.size, mtime = excluded.mtime,
                        checksum = excluded.checksum,
                        ingested_by = CASE WHEN shard_ledger.checksum = excluded.checksum
                            THEN shard_ledger.ingested_by ELSE excluded.ingested_by END,
                        ingested_at = CASE WHEN shard_ledger.checksum = excluded.checksum
                            THEN shard_ledger.ingested_at ELSE excluded.ingested_at END
                    """,
                    [source, shard.path, shard.size, shard.mtime, shard.checksum, now, run_id, now],
                )
            con.execute("COMMIT")
        return changes

    def rows(self, source: str | None = None) -> list[dict]:
        """The ledger's entries (of one source), ordered by source and path."""
        if not self.path.exists():
            return []
        where, params = ("WHERE source = ?", [source]) if source is not None else ("", [])
        with self._connect(read_only=True) as con:
            cursor = con.execute(f"SELECT * FROM shard_ledger {where} ORDER BY source, path", params)
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    @contextlib.contextmanager
    def _connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if read_only and not self.path.exists():
            read_only = False  # the first reader creates the table
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.IOException as error:
                if "lock" not in str(error).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            if not read_only:
                con.execute(SCHEMA)
            yield con
        finally:
            con.close()


def _seconds(mtime: object) -> float | None:
    if isinstance(mtime, datetime):
        return mtime.timestamp()
    return float(mtime) if mtime is not None else None
