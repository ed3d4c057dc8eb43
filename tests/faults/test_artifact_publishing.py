"""Issue 35, item 3: a stage's artefacts are published all or nothing. An upload cut at any file leaves
readers on the previous version, whole; a file that does not match the manifest's sha256 is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_dag.storage.artifact_manifest import ARTIFACT_MANIFEST, ArtifactIntegrityError
from moe_dag.storage.lake import Lake

NAMES = ("a.bin", "b.bin", "run/c.bin")


def _lake(tmp_path: Path, cache: str) -> Lake:
    return Lake(f"memory://lake-{tmp_path.name}", cache_dir=tmp_path / cache)


def _write_version(lake: Lake, version: int) -> None:
    folder = lake.artifact_dir("heads")
    for name in NAMES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(f"{name} of version {version}".encode())


def _read_fresh(tmp_path: Path, cache: str) -> dict[str, str]:
    folder = _lake(tmp_path, cache).artifact_dir("heads")
    return {name: (folder / name).read_text() for name in NAMES}


def _remote_files(lake: Lake) -> list[str]:
    lake.fs.invalidate_cache()
    return sorted(lake.fs.find(f"{lake.root}/heads"))


@pytest.mark.parametrize("cut_at", range(1, len(NAMES) + 1))
def test_an_upload_cut_at_any_file_leaves_readers_on_the_whole_previous_version(
    tmp_path, monkeypatch, cut_at
):
    writer = _lake(tmp_path, "writer")
    _write_version(writer, 1)
    writer.publish_artifact("heads")
    _write_version(writer, 2)

    upload = writer.fs.put_file
    calls = []

    def cut(*args, **kwargs):
        calls.append(args)
        if len(calls) == cut_at:
            raise ConnectionError("connection reset by the store")
        return upload(*args, **kwargs)

    monkeypatch.setattr(writer.fs, "put_file", cut)
    with pytest.raises(ConnectionError):
        writer.publish_artifact("heads")
    monkeypatch.undo()

    assert _read_fresh(tmp_path, "reader") == {name: f"{name} of version 1" for name in NAMES}
    writer.publish_artifact("heads")  # the retry completes the new version
    assert _read_fresh(tmp_path, "second-reader") == {name: f"{name} of version 2" for name in NAMES}
    # Objects of the old version and of the cut upload are gone: the manifest and one file per name.
    assert len(_remote_files(writer)) == 1 + len(NAMES)


def test_a_pulled_file_that_does_not_match_its_sha256_is_refused_with_its_name(tmp_path):
    writer = _lake(tmp_path, "writer")
    _write_version(writer, 1)
    writer.publish_artifact("heads")
    for path in _remote_files(writer):
        if not path.endswith(ARTIFACT_MANIFEST):  # same size, other bytes: only the digest tells
            writer.fs.pipe_file(path, writer.fs.cat_file(path).swapcase())
    reader = _lake(tmp_path, "reader")
    with pytest.raises(ArtifactIntegrityError, match=r"heads/_artifact\.json: 'a\.bin'.*sha256"):
        reader.artifact_dir("heads")
    assert not (tmp_path / "reader" / "heads" / "a.bin").exists()


def test_a_file_unchanged_between_versions_is_not_uploaded_again(tmp_path, monkeypatch):
    writer = _lake(tmp_path, "writer")
    _write_version(writer, 1)
    writer.publish_artifact("heads")
    (writer.artifact_dir("heads") / "a.bin").write_bytes(b"new a")
    uploaded = []
    upload = writer.fs.put_file
    monkeypatch.setattr(
        writer.fs, "put_file", lambda local, *rest, **kw: (uploaded.append(local), upload(local, *rest, **kw))
    )
    writer.publish_artifact("heads")
    assert [Path(path).name for path in uploaded] == ["a.bin"]
    assert _read_fresh(tmp_path, "reader")["a.bin"] == "new a"
