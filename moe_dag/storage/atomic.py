"""Atomic writes for every artefact: lake tables, heads, checkpoints, manifests.

A file is written under a hidden temporary name beside its final path and renamed into place only once
it is complete, so a reader (or a rerun after kill -9) sees the old file or the new one, never half of
one. When the write fails (a full disk, a file-size limit, a writer's own error) the temporary file is
removed and the error names the final path: torch reports a full disk as "basic_ios::clear" and pyarrow
as a bare errno, neither saying which artefact was lost.

`atomic_write` gives a binary handle on any fsspec filesystem; `atomic_path` gives a local temporary
path for writers that only take a path (safetensors, torch.save, numpy memmaps).
"""

from __future__ import annotations

import contextlib
import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import fsspec

TEMPORARY_PREFIX = ".tmp-"


class ArtefactWriteError(OSError):
    """Writing an artefact failed; nothing was left at its path or beside it."""


def temporary_name(final: str) -> str:
    """A hidden sibling of `final`: no `*.parquet` or `*.json` glob of a reader matches it."""
    folder, name = posixpath.split(final)
    return posixpath.join(folder, f"{TEMPORARY_PREFIX}{uuid.uuid4().hex[:12]}-{name}.partial")


@contextlib.contextmanager
def atomic_write(path: str, fs: fsspec.AbstractFileSystem | None = None) -> Iterator[IO[bytes]]:
    """Open a temporary file for writing bytes; on success it replaces `path` in one rename."""
    if fs is None:
        fs, path = fsspec.core.url_to_fs(str(path))
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    partial = temporary_name(path)
    try:
        with fs.open(partial, "wb") as handle:
            yield handle
        fs.mv(partial, path)
    except BaseException as error:
        _remove_quietly(fs, partial)
        if isinstance(error, Exception):
            raise write_error(error, path) from error
        raise


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A local temporary path to write to; on success it is renamed onto `path`."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(temporary_name(str(final)))
    try:
        yield partial
        partial.replace(final)
    except BaseException as error:
        partial.unlink(missing_ok=True)
        if isinstance(error, Exception):
            raise write_error(error, str(final)) from error
        raise


def write_error(error: Exception, path: str) -> ArtefactWriteError:
    """`error` as an ArtefactWriteError that names `path`, the file that could not be written."""
    if isinstance(error, ArtefactWriteError):
        return error
    message = f"could not write {path}: {error}"
    if isinstance(error, OSError) and error.errno is not None:
        return ArtefactWriteError(error.errno, message)
    return ArtefactWriteError(message)


def _remove_quietly(fs: fsspec.AbstractFileSystem, path: str) -> None:
    # The original error matters more than a failure to clean up after it.
    with contextlib.suppress(OSError):
        if fs.exists(path):
            fs.rm(path)
