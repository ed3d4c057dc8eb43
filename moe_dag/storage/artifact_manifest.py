"""The manifest of a stage's published artefacts on an object-store lake, and the checks on what it names.

A manifest lists every file of one published version by name, with its size and sha256. The files
themselves are stored under their content's name (`<stage>/_objects/<sha256>`), so uploading a new
version overwrites nothing the published one uses, and the manifest, written last, switches readers
from one version to the next at once. A machine that pulls the artefact writes each named file into its
local mirror, so the names are chosen by whoever can write the bucket: each one is checked to stay
inside the mirror's folder (a relative POSIX path with no `..`, `.`, empty or hidden part, no
backslash, and no link on the way) before anything is fetched, and each fetched file must match its
sha256 before it takes its name.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

# The published version of a stage's artefacts on an object-store lake, written after every file it lists.
ARTIFACT_MANIFEST = "_artifact.json"
# Where a stage's published files are stored on the lake, each under its sha256.
OBJECTS_DIR = "_objects"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class UnsafeArtifactName(ValueError):
    """A manifest names a file outside its artefact's folder, or a path through a link."""


class ArtifactIntegrityError(ValueError):
    """A fetched artefact file does not match the size and sha256 its manifest lists."""


def object_path(sha256: str) -> str:
    """Where the file with this content is stored, relative to its stage's folder on the lake."""
    return f"{OBJECTS_DIR}/{sha256}"


def folder_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a local artefact folder: every visible file's size and sha256, and a version
    derived from them. A link is refused: publishing one would upload whatever it points at."""
    files = {}
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if any(part.startswith(".") for part in parts):
            continue
        relative = "/".join(parts)
        if path.is_symlink():
            raise UnsafeArtifactName(f"{path}: {relative!r} is a link; artefact folders hold plain files")
        if path.is_file() and relative != ARTIFACT_MANIFEST:
            files[relative] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    version = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": version, "files": files}


def checked_manifest(manifest: dict[str, Any], where: str, folder: Path) -> dict[str, Any]:
    """`manifest` (read from `where`) once every name is known to land inside `folder` and every digest is
    a sha256; raises UnsafeArtifactName naming the first that is not."""
    for name, entry in manifest["files"].items():
        local_target(folder, name, where)
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            raise UnsafeArtifactName(
                f"{where}: {name!r} has a digest that is not a sha256: {entry.get('sha256')!r}"
            )
    return manifest


def local_target(folder: Path, name: str, where: str) -> Path:
    """Where file `name` of a manifest read from `where` goes in `folder`, refused unless it lies inside."""
    parts = PurePosixPath(name).parts
    if (
        not name
        or "\\" in name
        or name.startswith("/")
        or "/".join(parts) != name  # `a//b`, `a/./b`, a trailing slash
        or any(part in ("..", ".") or part.startswith(".") for part in parts)
    ):
        raise UnsafeArtifactName(
            f"{where}: {name!r} is not a plain relative path inside the artefact (no '..', '.', hidden or "
            "empty part, no absolute path, no backslash)"
        )
    target = folder
    for part in parts:
        target = target / part
        if target.is_symlink():
            raise UnsafeArtifactName(f"{where}: {name!r} would be written through a link at {target}")
    return target


def verify_file(path: Path, entry: dict[str, Any], name: str, where: str) -> None:
    """Refuse `path`, fetched as file `name` of the manifest at `where`, unless it matches `entry`."""
    size, digest = path.stat().st_size, file_sha256(path)
    if size != entry["size"] or digest != entry["sha256"]:
        raise ArtifactIntegrityError(
            f"{where}: {name!r} was fetched with {size} bytes and sha256 {digest}, the manifest lists "
            f"{entry['size']} bytes and sha256 {entry['sha256']}: refused (rewritten in the bucket?)"
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
