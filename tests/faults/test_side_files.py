"""Issue 35, item 7: the JSON files beside the dedup clusters (`versions.json`, `arrival.json`) are written
atomically like every other artefact, so a write cut half way leaves the old file (or none), never a torn
one; and a torn one found all the same is refused with its path, not a bare JSONDecodeError."""

from __future__ import annotations

import errno
import random

import pytest

from moe_dag.curation.dedup import compute_signatures
from moe_dag.curation.dedup.partitioned import (
    ARRIVAL_FILE,
    VERSIONS_FILE,
    cluster_partitioned,
    recorded_arrivals,
    recorded_versions,
)
from moe_dag.storage.lake import Lake
from tests.test_dedup_distributed import CONFIG, SOURCES, corpus, write_signatures

READERS = {ARRIVAL_FILE: recorded_arrivals, VERSIONS_FILE: recorded_versions}


def _clustered(tmp_path) -> Lake:
    lake = Lake(tmp_path / "lake")
    write_signatures(lake, compute_signatures(corpus(1), CONFIG), shards=2, rng=random.Random(1))
    cluster_partitioned(lake, SOURCES, CONFIG, parts=2)
    return lake


class _DiesMidWrite:
    """A file handle that writes the first 60 bytes it is given, then fails as a full disk does."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()

    def write(self, data: bytes) -> int:
        self.handle.write(data[:60])
        self.handle.close()
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("name", [ARRIVAL_FILE, VERSIONS_FILE])
def test_a_side_file_write_cut_half_way_leaves_no_torn_file(tmp_path, monkeypatch, name):
    lake = _clustered(tmp_path)
    side_file = tmp_path / "lake" / "dedup_clusters" / name
    before = side_file.read_bytes()
    real_open = lake.fs.open

    def open_dying(path, mode="rb", **kwargs):
        handle = real_open(path, mode, **kwargs)
        return _DiesMidWrite(handle) if "w" in mode and name in str(path) else handle

    monkeypatch.setattr(lake.fs, "open", open_dying)
    with pytest.raises(OSError, match="No space left"):
        cluster_partitioned(lake, SOURCES, CONFIG, parts=2)
    monkeypatch.undo()
    # The old file, or none (versions.json is removed while a clustering runs): never 60 bytes of one.
    assert not side_file.exists() or side_file.read_bytes() == before
    assert [p.name for p in side_file.parent.iterdir() if p.name.startswith(".")] == []
    READERS[name](lake)  # reads without an error


@pytest.mark.parametrize("name", [ARRIVAL_FILE, VERSIONS_FILE])
def test_a_torn_side_file_is_refused_with_its_path(tmp_path, name):
    lake = _clustered(tmp_path)
    side_file = tmp_path / "lake" / "dedup_clusters" / name
    side_file.write_bytes(side_file.read_bytes()[:60])
    with pytest.raises(
        ValueError, match=rf"dedup_clusters/{name}: not valid JSON .*rematerialise dedup_clusters"
    ):
        READERS[name](lake)
