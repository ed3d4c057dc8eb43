"""Issue 35, item 1: an artefact manifest in an object-store lake names files the pulling machine writes.
Anyone who can write the bucket chooses those names, so each must stay inside the artefact's folder: no
`..`, no absolute path, no hidden part (the mirror's own bookkeeping), no path through a link."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from pathlib import Path

import pytest

from moe_dag.storage.artifact_manifest import ARTIFACT_MANIFEST, UnsafeArtifactName, object_path
from moe_dag.storage.lake import Lake

PAYLOAD = b"escaped"


def _lake(tmp_path: Path, name: str = "reader") -> Lake:
    return Lake(f"memory://lake-{tmp_path.name}", cache_dir=tmp_path / name)


def _plant_manifest(lake: Lake, stage: str, names: list[str]) -> None:
    """What an attacker with write access to the bucket does: one object, listed under each name."""
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    lake.fs.pipe_file(posixpath.join(lake.root, stage, object_path(digest)), PAYLOAD)
    files = {name: {"size": len(PAYLOAD), "sha256": digest} for name in names}
    manifest = {"version": "planted", "files": files}
    lake.fs.pipe_file(f"{lake.root}/{stage}/{ARTIFACT_MANIFEST}", json.dumps(manifest).encode())


@pytest.mark.parametrize(
    "name",
    [
        "../../../../../../escaped/ESCAPED.txt",
        "run/../../escaped/ESCAPED.txt",
        "/tmp/escaped/ESCAPED.txt",
        "run//ESCAPED.txt",
        "run/./ESCAPED.txt",
        ".artifact.json",
        "run\\..\\ESCAPED.txt",
        "",
    ],
)
def test_a_manifest_name_that_leaves_the_artifact_is_refused_with_the_name(tmp_path, name):
    lake = _lake(tmp_path)
    _plant_manifest(lake, "heads", ["weights.bin", name])
    with pytest.raises(UnsafeArtifactName, match=r"heads/_artifact\.json: " + re.escape(repr(name))):
        lake.artifact_dir("heads")
    assert not [p for p in tmp_path.rglob("ESCAPED.txt")]
    assert not (tmp_path / "reader" / "heads" / "weights.bin").exists()  # nothing pulled at all


def test_a_manifest_name_through_a_link_in_the_mirror_is_refused(tmp_path):
    lake = _lake(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "reader" / "heads").mkdir(parents=True)
    (tmp_path / "reader" / "heads" / "run").symlink_to(outside)
    _plant_manifest(lake, "heads", ["run/ESCAPED.txt"])
    with pytest.raises(UnsafeArtifactName, match=r"run/ESCAPED\.txt.*link"):
        lake.artifact_dir("heads")
    assert not list(outside.iterdir())


def test_a_link_in_the_folder_being_published_is_refused(tmp_path):
    lake = _lake(tmp_path, "writer")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the bucket")
    folder = lake.artifact_dir("heads")
    (folder / "weights.bin").symlink_to(secret)
    with pytest.raises(UnsafeArtifactName, match=r"weights\.bin.*link"):
        lake.publish_artifact("heads")


def test_a_manifest_digest_that_is_not_a_sha256_is_refused(tmp_path):
    lake = _lake(tmp_path)
    files = {"weights.bin": {"size": 1, "sha256": "../../other-stage/_artifact.json"}}
    lake.fs.pipe_file(
        f"{lake.root}/heads/{ARTIFACT_MANIFEST}", json.dumps({"version": "x", "files": files}).encode()
    )
    with pytest.raises(UnsafeArtifactName, match=r"weights\.bin.*not a sha256"):
        lake.artifact_dir("heads")


def test_nested_names_inside_the_artifact_still_round_trip(tmp_path):
    writer = _lake(tmp_path, "writer")
    with writer.writing_artifact("heads") as folder:
        (folder / "run-a" / "step_1").mkdir(parents=True)
        (folder / "run-a" / "step_1" / "model.safetensors").write_bytes(b"weights")
    pulled = _lake(tmp_path).artifact_dir("heads")
    assert (pulled / "run-a" / "step_1" / "model.safetensors").read_bytes() == b"weights"
