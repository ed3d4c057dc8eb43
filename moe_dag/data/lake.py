"""The lake: parquet datasets and artefacts under one root folder or fsspec URL.

Layout: `<stage>/source=<name>/part-00000.parquet` for per-source stages, `<stage>/part-00000.parquet`
for global ones, and `<stage>/...` folders for artefacts (models, token shards, checkpoints).

A write replaces exactly its own slice (one source of one stage), so rerunning a partition is
idempotent. Files are written under a hidden temporary name and renamed into place: a killed run never
leaves a half-written file that the `part-*.parquet` glob of a reader would pick up.
"""

from __future__ import annotations

import posixpath
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

PART_NAME = "part-00000.parquet"


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

    def glob_pattern(self, stage: str, partitioned: bool) -> str:
        """A glob over every part file of a stage, for DuckDB's read_parquet."""
        middle = "*/" if partitioned else ""
        prefix = self.root if self.is_local else f"{self.fs.protocol[0]}://{self.root}"
        return f"{prefix}/{stage}/{middle}part-*.parquet"

    def write_table(self, table: pa.Table, stage: str, source: str | None = None) -> str:
        """Replace the stage's slice for `source` with `table`; returns the final path."""
        folder = self.dataset_dir(stage, source)
        self.fs.makedirs(folder, exist_ok=True)
        final = posixpath.join(folder, PART_NAME)
        temporary = posixpath.join(folder, f".tmp-{uuid.uuid4().hex}.parquet")
        with self.fs.open(temporary, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
        for stale in self.fs.glob(posixpath.join(folder, "part-*.parquet")):
            if stale != final:
                self.fs.rm(stale)
        self.fs.mv(temporary, final)
        return final

    def has_table(self, stage: str, source: str | None = None) -> bool:
        return self.fs.exists(posixpath.join(self.dataset_dir(stage, source), PART_NAME))

    def read_table(self, stage: str, source: str | None = None, columns: list[str] | None = None) -> pa.Table:
        path = posixpath.join(self.dataset_dir(stage, source), PART_NAME)
        if not self.fs.exists(path):
            where = f"{stage} for source {source!r}" if source else stage
            raise FileNotFoundError(f"{where} has not been materialised yet: {path} does not exist")
        with self.fs.open(path, "rb") as handle:
            return pq.read_table(handle, columns=columns)

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
