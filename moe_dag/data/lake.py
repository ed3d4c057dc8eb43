"""The lake: parquet datasets and artefacts under one root folder or fsspec URL.

Layout:

    <stage>/source=<name>/<shard-key>.parquet    per-source stages, one file per input shard
    <stage>/source=<name>/_done/<shard-key>.json  the shard's completion record (written last)
    <stage>/part-00000.parquet                   global stages (dedup clusters, oracle labels, ...)
    <stage>/...                                  artefact folders (models, token shards, checkpoints)

A shard file is keyed by the raw input shard it descends from, through every stage, so a rerun redoes
exactly the shards without a completion record and a shard added to a source is processed alone (see
`moe_dag.data.engine`). Every file is written under a hidden temporary name and renamed into place
(`moe_dag.data.atomic`): a killed run never leaves a half-written file that the `*.parquet` glob of a
reader would pick up, and the completion record is written only after the files it vouches for.
"""

from __future__ import annotations

import glob
import json
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from moe_dag.data.atomic import TEMPORARY_PREFIX, atomic_write

PART_NAME = "part-00000.parquet"
RECORDS_DIR = "_done"
BATCH_ROWS = 2048


class Lake:
    def __init__(self, root: str | Path) -> None:
        self.url = str(root)
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        if self.is_local:
            self.root = str(Path(self.root).resolve())

    @property
    def is_local(self) -> bool:
        return "file" in self.fs.protocol

    def dataset_dir(self, stage: str, source: str | None = None) -> str:
        parts = [self.root, stage] + ([f"source={source}"] if source is not None else [])
        return posixpath.join(*parts)

    def shard_path(self, stage: str, source: str, key: str, suffix: str = ".parquet") -> str:
        return posixpath.join(self.dataset_dir(stage, source), f"{key}{suffix}")

    def glob_pattern(self, stage: str, partitioned: bool) -> str:
        """A glob over every data file of a stage, for DuckDB's read_parquet (and fsspec's glob)."""
        middle = "source=*/" if partitioned else ""
        prefix = glob.escape(self.root)
        prefix = prefix if self.is_local else f"{self.fs.protocol[0]}://{prefix}"
        return f"{prefix}/{stage}/{middle}*.parquet"

    def files_matching(self, folder: str, pattern: str) -> list[str]:
        """The paths in `folder` that match `pattern`. The folder is taken literally: a root such as
        `runs[1]/lake` holds glob characters that would otherwise match nothing (or something else)."""
        return self.fs.glob(posixpath.join(glob.escape(folder), pattern))

    def parquet_files(self, stage: str, source: str | None = None) -> list[str]:
        """The data files of one slice (a source of a stage, or a global stage), sorted by name."""
        return sorted(self.files_matching(self.dataset_dir(stage, source), "*.parquet"))

    def write_table(self, table: pa.Table, stage: str, source: str | None = None) -> str:
        """Replace the whole slice with `table` in one file; returns its path.

        For global stages and small whole-slice tables. Per-source stages that fan out over shards write
        one file per shard through the engine instead."""
        folder = self.dataset_dir(stage, source)
        final = posixpath.join(folder, PART_NAME)
        self.write_file(table, final)
        for stale in self.parquet_files(stage, source):
            if stale != final:
                self.fs.rm(stale)
        self._remove_records(folder)
        return final

    def fingerprint(self, stage: str, source: str | None = None) -> str:
        """Names, sizes and modification times of a slice's files: changes whenever the slice is rewritten."""
        parts = []
        for path in self.parquet_files(stage, source):
            info = self.fs.info(path)
            parts.append(f"{path}:{info.get('size')}:{info.get('mtime') or info.get('LastModified')}")
        return "\n".join(parts)

    def has_table(self, stage: str, source: str | None = None) -> bool:
        return bool(self.parquet_files(stage, source))

    def read_table(self, stage: str, source: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """Every row of the slice, shard files concatenated in key order. Loads the whole slice: use
        `iter_batches` for anything that grows with the corpus."""
        files = self._existing_files(stage, source)
        tables = [self.read_file(path, columns) for path in files]
        return pa.concat_tables(tables, promote_options="default")

    def iter_batches(
        self,
        stage: str,
        source: str | None = None,
        columns: list[str] | None = None,
        batch_rows: int = BATCH_ROWS,
    ) -> Iterator[pa.Table]:
        """The slice's rows in batches of at most `batch_rows`, one file open at a time."""
        for path in self._existing_files(stage, source):
            yield from read_batches(path, self.fs, columns, batch_rows)

    def read_file(self, path: str, columns: list[str] | None = None) -> pa.Table:
        with self.fs.open(path, "rb") as handle:
            return pq.read_table(handle, columns=columns)

    def write_file(self, table: pa.Table, path: str) -> None:
        """Replace one file of the lake with `table`, atomically."""
        with atomic_write(path, self.fs) as handle:
            pq.write_table(table, handle, compression="zstd")

    def read_record(self, stage: str, source: str, key: str) -> dict[str, Any] | None:
        path = self._record_path(stage, source, key)
        try:
            with self.fs.open(path, "rb") as handle:
                return json.loads(handle.read())
        except FileNotFoundError:
            return None

    def records(self, stage: str, source: str) -> dict[str, dict[str, Any]]:
        """Completion records of a slice by shard key."""
        folder = posixpath.join(self.dataset_dir(stage, source), RECORDS_DIR)
        found = {}
        for path in sorted(self.files_matching(folder, "*.json")):
            with self.fs.open(path, "rb") as handle:
                found[posixpath.basename(path).removesuffix(".json")] = json.loads(handle.read())
        return found

    def write_record(self, stage: str, source: str, key: str, record: dict[str, Any]) -> None:
        with atomic_write(self._record_path(stage, source, key), self.fs) as handle:
            handle.write(json.dumps(record, sort_keys=True).encode())

    def stored_keys(self, stage: str, source: str) -> set[str]:
        """Keys of every shard with a file in the slice, finished or not (temporaries aside)."""
        folder = self.dataset_dir(stage, source)
        paths = self.files_matching(folder, "*.*")
        return {_stem(path) for path in paths if not posixpath.basename(path).startswith(".")}

    def remove_record(self, stage: str, source: str, key: str) -> None:
        """Mark a shard unfinished: the next run redoes it."""
        path = self._record_path(stage, source, key)
        if self.fs.exists(path):
            self.fs.rm(path)

    def remove_shard(self, stage: str, source: str, key: str) -> None:
        """The shard's record first, so a kill half way leaves a shard that will be redone."""
        for path in [self._record_path(stage, source, key), *self._shard_files(stage, source, key)]:
            if self.fs.exists(path):
                self.fs.rm(path)

    def remove_temporaries(self, stage: str, source: str) -> None:
        """Partial files a killed run left behind (one run writes a slice at a time)."""
        folder = self.dataset_dir(stage, source)
        for pattern in (f"{TEMPORARY_PREFIX}*", f"{RECORDS_DIR}/{TEMPORARY_PREFIX}*"):
            for path in self.files_matching(folder, pattern):
                self.fs.rm(path)

    def artifact_dir(self, stage: str) -> Path:
        """A local folder for a stage's non-tabular artefacts (models, token files, checkpoints).

        These are written by libraries that expect a filesystem path (safetensors, numpy memmaps,
        torch checkpoints), so they need a local lake; remote lakes sync such folders separately.
        """
        if not self.is_local:
            raise ValueError(f"artefacts need a local lake root, got {self.url}")
        folder = Path(self.root) / stage
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _existing_files(self, stage: str, source: str | None) -> list[str]:
        files = self.parquet_files(stage, source)
        if not files:
            where = f"{stage} for source {source!r}" if source else stage
            raise FileNotFoundError(
                f"{where} has not been materialised yet: {self.dataset_dir(stage, source)} holds no parquet"
            )
        return files

    def _record_path(self, stage: str, source: str, key: str) -> str:
        return posixpath.join(self.dataset_dir(stage, source), RECORDS_DIR, f"{key}.json")

    def _shard_files(self, stage: str, source: str, key: str) -> list[str]:
        # A shard may own several files (`<key>.parquet`, `<key>.bin`, `<key>.index.parquet`, ...).
        folder = self.dataset_dir(stage, source)
        return [p for p in self.files_matching(folder, f"{glob.escape(key)}.*") if _stem(p) == key]

    def _remove_records(self, folder: str) -> None:
        records = posixpath.join(folder, RECORDS_DIR)
        if self.fs.exists(records):
            self.fs.rm(records, recursive=True)


def read_batches(
    path: str, fs: fsspec.AbstractFileSystem, columns: list[str] | None = None, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.Table]:
    """One parquet file as tables of at most `batch_rows` rows; an empty file yields one empty table,
    so a caller always learns the schema."""
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        schema = parquet.schema_arrow
        if columns is not None:
            schema = pa.schema([schema.field(name) for name in columns])
        emitted = False
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            emitted = True
            yield pa.Table.from_batches([batch], schema=schema)
        if not emitted:
            yield schema.empty_table()


def _stem(path: str) -> str:
    return posixpath.basename(path).split(".", 1)[0]
