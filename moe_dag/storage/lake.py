"""The lake: parquet datasets and artefacts under one root folder or fsspec URL.

Layout:

    <stage>/source=<name>/<shard-key>.parquet    per-source stages, one file per input shard
    <stage>/source=<name>/_done/<shard-key>.json  the shard's completion record (written last)
    <stage>/part-00000.parquet                   global stages (dedup clusters, oracle labels, ...)
    <stage>/...                                  artefact folders (models, token shards, checkpoints)

A shard file is keyed by the raw input shard it descends from, through every stage, so a rerun redoes
exactly the shards without a completion record and a shard added to a source is processed alone (see
`moe_dag.engine`). Every file is written under a hidden temporary name and renamed into place
(`moe_dag.storage.atomic`): a killed run never leaves a half-written file that the `*.parquet` glob of a
reader would pick up, and the completion record is written only after the files it vouches for.
On an object store, a listing or a read that the store refuses, cannot be reached for or times out
raises one `ObjectStoreError` naming the endpoint and the fix (`moe_dag.storage.object_store`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import posixpath
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from moe_dag.storage.artifact_manifest import (
    ARTIFACT_MANIFEST,
    OBJECTS_DIR,
    checked_manifest,
    folder_manifest,
    local_target,
    object_path,
    verify_file,
)
from moe_dag.storage.atomic import TEMPORARY_PREFIX, atomic_path, atomic_write, temporary_name
from moe_dag.storage.object_store import object_store_errors

PART_NAME = "part-00000.parquet"
RECORDS_DIR = "_done"
BATCH_ROWS = 2048
# The version the local mirror holds (hidden: never listed, never uploaded).
LOCAL_MANIFEST = ".artifact.json"
# The remote files a local mirror of a slice holds (size and modification time or ETag by name).
LOCAL_SLICE_INDEX = ".slice.json"
CACHE_ENV = "MOE_DAG_LAKE_CACHE"


class Lake:
    def __init__(self, root: str | Path, cache_dir: str | Path | None = None) -> None:
        self.url = str(root)
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        if self.is_local:
            self.root = str(Path(self.root).resolve())
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(self.url)

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
        with self.store_errors(folder, "list"):
            return self.fs.glob(posixpath.join(glob.escape(folder), pattern))

    def store_errors(self, path: str, operation: str) -> contextlib.AbstractContextManager[None]:
        """`object_store_errors` for `path` of this lake: a refused, unreachable or timed-out store
        named with the fix; a local lake's errors pass as they are."""
        return object_store_errors(self.fs.unstrip_protocol(path), operation)

    def duckdb_paths(self, con: Any, paths: list[str]) -> list[str]:
        """`paths` of this lake as DuckDB connection `con` can read them: an object-store lake's
        filesystem is registered with it (its storage settings included, no httpfs download) and each
        path carries the protocol that routes it there."""
        if self.is_local:
            return paths
        if self.fs.protocol[0] not in con.list_filesystems():
            con.register_filesystem(self.fs)
        return [f"{self.fs.protocol[0]}://{path}" for path in paths]

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
        with self.store_errors(path, "read"), self.fs.open(path, "rb") as handle:
            return pq.read_table(handle, columns=columns)

    def write_file(self, table: pa.Table, path: str) -> None:
        """Replace one file of the lake with `table`, atomically."""
        with atomic_write(path, self.fs) as handle:
            pq.write_table(table, handle, compression="zstd")

    def read_json(self, path: str, fix: str) -> Any | None:
        """The JSON file at `path`, None when there is none; a file that is not JSON (torn, cut, nested
        past the parser) is refused with its path and `fix`, what to do about it."""
        try:
            with self.store_errors(path, "read"):
                data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as error:
            raise ValueError(f"{path}: not valid JSON ({type(error).__name__}: {error}); {fix}") from error

    def write_json(self, path: str, value: Any) -> None:
        """Replace the JSON file at `path` with `value`, atomically."""
        with atomic_write(path, self.fs) as handle:
            handle.write(json.dumps(value, indent=0, sort_keys=True).encode())

    def read_record(self, stage: str, source: str, key: str) -> dict[str, Any] | None:
        path = self._record_path(stage, source, key)
        return self.read_json(path, f"remove it: shard {key!r} of {stage}[{source}] is then redone")

    def records(self, stage: str, source: str) -> dict[str, dict[str, Any]]:
        """Completion records of a slice by shard key."""
        folder = posixpath.join(self.dataset_dir(stage, source), RECORDS_DIR)
        found = {}
        for path in sorted(self.files_matching(folder, "*.json")):
            with self.store_errors(path, "read"), self.fs.open(path, "rb") as handle:
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
        """A local folder holding a stage's non-tabular artefacts (models, token files, checkpoints).

        These are written and read by libraries that expect a filesystem path (safetensors, numpy
        memmaps, torch checkpoints, tokenizers). On a local lake this is the stage's folder in the lake.
        On an object-store lake it is the stage's mirror in the local cache, first brought up to the
        version last published to the lake (files the local copy does not yet have are left alone, so
        a writer's unpublished work survives a second call); write into it, then `publish_artifact`.
        """
        if self.is_local:
            folder = Path(self.root) / stage
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        folder = self.cache_dir / stage
        folder.mkdir(parents=True, exist_ok=True)
        self._pull_artifact(stage, folder)
        return folder

    def publish_artifact(self, stage: str) -> str | None:
        """Make the local folder of a stage's artefacts the lake's published version; returns the version.

        Nothing to do on a local lake (returns None). On an object-store lake each file the published
        version does not already hold is uploaded under its sha256 (`<stage>/_objects/<sha256>`), which
        no published manifest can be using yet, then the manifest (every file's name, size and sha256)
        is written last: a reader sees the old version or the new one, never a mix, however the upload
        is cut. Objects the new manifest does not list (the old version's, a cut upload's) are removed
        afterwards. One writer per stage at a time (one materialisation)."""
        if self.is_local:
            return None
        folder = self.cache_dir / stage
        manifest = folder_manifest(folder)
        remote = posixpath.join(self.root, stage)
        objects = posixpath.join(remote, OBJECTS_DIR)
        # Only objects the published version lists are known whole: a cut upload may have left others.
        stored = {entry["sha256"] for entry in self._remote_manifest(stage)["files"].values()}
        stored &= self._stored_objects(objects)
        self.fs.makedirs(objects, exist_ok=True)
        for name, entry in manifest["files"].items():
            if entry["sha256"] not in stored:
                self.fs.put_file(str(folder / name), posixpath.join(remote, object_path(entry["sha256"])))
                stored.add(entry["sha256"])
        with atomic_write(posixpath.join(remote, ARTIFACT_MANIFEST), self.fs) as handle:
            handle.write(json.dumps(manifest, sort_keys=True).encode())
        listed = {entry["sha256"] for entry in manifest["files"].values()}
        for digest in sorted(self._stored_objects(objects) - listed):
            self.fs.rm(posixpath.join(remote, object_path(digest)))
        _write_json(folder / LOCAL_MANIFEST, manifest)
        return manifest["version"]

    @contextlib.contextmanager
    def writing_artifact(self, stage: str) -> Iterator[Path]:
        """`artifact_dir` to write into, published when the block ends without an error."""
        folder = self.artifact_dir(stage)
        yield folder
        self.publish_artifact(stage)

    def artifact(self, stage: str, name: str = "") -> LakeArtifact:
        """The stage's artefact folder (or `name` inside it) as a path another process can resolve."""
        return LakeArtifact(self.root if self.is_local else self.url, stage, name, str(self.cache_dir))

    def artifact_version(self, stage: str) -> str | None:
        """The published version of a stage's artefacts on an object-store lake (None if never
        published, and on a local lake, whose folder is always current)."""
        return None if self.is_local else self._remote_manifest(stage)["version"]

    def local_slice(self, stage: str, source: str | None = None) -> Path:
        """A local folder with the files of a slice, for readers that need paths (token shards are
        memory-mapped). A local lake's own folder; for an object-store lake a mirror in the cache, with
        the files that changed since the last call downloaded (by size and modification time or ETag)."""
        if self.is_local:
            return Path(self.dataset_dir(stage, source))
        remote_folder = self.dataset_dir(stage, source)
        folder = self.cache_dir / posixpath.relpath(remote_folder, self.root)
        folder.mkdir(parents=True, exist_ok=True)
        index_path = folder / LOCAL_SLICE_INDEX
        held = json.loads(index_path.read_text()) if index_path.exists() else {}
        current = {}
        # Another process (a Ray worker) may have rewritten a shard since this one listed the folder.
        self.fs.invalidate_cache(remote_folder)
        listed = self.fs.ls(remote_folder, detail=True) if self.fs.exists(remote_folder) else []
        for info in listed:
            name = posixpath.basename(info["name"])
            if info["type"] != "file" or name.startswith("."):
                continue
            current[name] = (
                f"{info.get('size')}:{info.get('mtime') or info.get('ETag') or info.get('LastModified')}"
            )
            if held.get(name) != current[name] or not (folder / name).exists():
                with atomic_path(folder / name) as partial:
                    self.fs.get_file(info["name"], str(partial))
        for name in set(held) - set(current):
            (folder / name).unlink(missing_ok=True)
        _write_json(index_path, current)
        return folder

    @contextlib.contextmanager
    def local_file_for_writing(self, path: str) -> Iterator[Path]:
        """A local temporary path for a lake file written by a library that takes a path; on success it
        becomes `path` (renamed on a local lake, uploaded under a temporary name and moved on an
        object-store lake)."""
        if self.is_local:
            with atomic_path(path) as partial:
                yield partial
            return
        staging = self.cache_dir / ".staging"
        staging.mkdir(parents=True, exist_ok=True)
        partial = Path(temporary_name(str(staging / posixpath.basename(path))))
        try:
            yield partial
            with partial.open("rb") as source, atomic_write(path, self.fs) as handle:
                shutil.copyfileobj(source, handle, 1 << 20)
        finally:
            partial.unlink(missing_ok=True)

    def _remote_manifest(self, stage: str) -> dict[str, Any]:
        path = posixpath.join(self.root, stage, ARTIFACT_MANIFEST)
        self.fs.invalidate_cache(path)  # another machine may have published since this process looked
        try:
            with self.fs.open(path, "rb") as handle:
                return json.loads(handle.read())
        except FileNotFoundError:
            return {"version": None, "files": {}}

    def _pull_artifact(self, stage: str, folder: Path) -> None:
        where = posixpath.join(self.root, stage, ARTIFACT_MANIFEST)
        remote = checked_manifest(self._remote_manifest(stage), where, folder)
        local_path = folder / LOCAL_MANIFEST
        local = json.loads(local_path.read_text()) if local_path.exists() else {"version": None, "files": {}}
        if remote["version"] is None or remote["version"] == local["version"]:
            return
        for name, entry in remote["files"].items():
            target = local_target(folder, name, where)
            if (
                local["files"].get(name) == entry
                and target.exists()
                and target.stat().st_size == entry["size"]
            ):
                continue
            self._fetch_verified(
                posixpath.join(self.root, stage, object_path(entry["sha256"])), target, entry, name, where
            )
        for name in set(local["files"]) - set(remote["files"]):
            (folder / name).unlink(missing_ok=True)
        _write_json(local_path, remote)

    def _fetch_verified(self, path: str, target: Path, entry: dict[str, Any], name: str, where: str) -> None:
        """Download `path` as `target`, which it becomes only once it matches `entry` (size, sha256)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(temporary_name(str(target)))
        try:
            self.fs.get_file(path, str(partial))
            verify_file(partial, entry, name, where)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)

    def _stored_objects(self, objects: str) -> set[str]:
        """The digests of the files stored under a stage's objects folder."""
        self.fs.invalidate_cache(objects)
        return (
            {posixpath.basename(path) for path in self.fs.find(objects)} if self.fs.exists(objects) else set()
        )

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
    with object_store_errors(fs.unstrip_protocol(path), "read"), fs.open(path, "rb") as handle:
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


def duckdb_reading(files: object) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection that can read `files` (a path or glob, a list of them, or
    anything else, which needs nothing): the fsspec filesystem of each object-store URL among them is
    registered, with fsspec's configured storage settings, so DuckDB needs no httpfs extension."""
    con = duckdb.connect()
    paths = [files] if isinstance(files, str) else files if isinstance(files, (list, tuple)) else []
    for protocol in sorted({str(p).split("://", 1)[0] for p in paths if "://" in str(p)} - {"file"}):
        if protocol not in con.list_filesystems():
            con.register_filesystem(fsspec.filesystem(protocol))
    return con


def default_cache_dir(url: str) -> Path:
    """Where an object-store lake's artefacts are mirrored on this machine: `$MOE_DAG_LAKE_CACHE`, else
    under `~/.cache/moe_dag/lakes`, one folder per lake URL."""
    base = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "moe_dag" / "lakes")
    return base / hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class LakeArtifact:
    """A stage's artefact folder named by lake URL, for processes that may run on another machine (Ray
    actors): used as a path (`os.fspath`), it is that machine's local copy of the published version."""

    lake_url: str
    stage: str
    name: str = ""  # a file or folder inside the stage's folder
    cache_dir: str | None = None

    def __fspath__(self) -> str:
        return str(Lake(self.lake_url, self.cache_dir).artifact_dir(self.stage) / self.name)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    with atomic_path(path) as partial:
        partial.write_text(json.dumps(value, sort_keys=True))


def _stem(path: str) -> str:
    return posixpath.basename(path).split(".", 1)[0]
