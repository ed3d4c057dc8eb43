"""Shard keys, shard inputs and the plan of a stage run: which shards to (re)do, which to remove.

A shard key names an input shard through every stage (`lake/<stage>/source=<s>/<key>.parquet`). It is
the shard's path below the source's shard location, without its suffix, with every character other
than letters, digits, `-` and `_` replaced by `_`: readable, and safe as a file name anywhere.

A shard is done when its completion record carries the digest the stage would give it now: a hash of
the stage, its parameters (config, model versions) and the input's fingerprint (a raw shard's size and
modification time; the upstream shard's digest). So a new shard, a changed raw shard or a changed
config is redone, shards whose input has gone are removed, and everything else is left as it is. A
record lists the files it vouches for with their sizes: a shard whose file is missing or of another
size is redone, whatever its record says.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

import fsspec

from moe_dag.storage.lake import Lake
from moe_dag.storage.object_store import object_store_errors
from moe_dag.storage.readers import SHARD_SUFFIXES

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class ShardInput:
    key: str
    path: str  # the file the stage reads for this shard
    fingerprint: str  # the identity of that file's content, as far as the output depends on it
    # A block of the shard (blocks.py): [start, stop) of `path` in the units its work splits it by, rows
    # of a parquet file (bytes of a JSON-lines raw shard for ingest).
    span: tuple[int, int] | None = None


@dataclass
class ShardPlan:
    todo: list[ShardInput]
    done: dict[str, dict[str, Any]]  # completion records still valid, by key
    removed: list[str] = field(default_factory=list)  # shards whose input is gone


def shard_key(path: str, location: str) -> str:
    """The key of raw shard `path` found under `location` (see the module docstring)."""
    _, root = fsspec.core.url_to_fs(location)
    _, bare = fsspec.core.url_to_fs(path)
    relative = posixpath.relpath(bare, root) if bare != root else posixpath.basename(bare)
    for suffix in sorted(SHARD_SUFFIXES, key=len, reverse=True):
        if relative.endswith(suffix):
            relative = relative.removesuffix(suffix)
            break
    return _UNSAFE.sub("_", relative).strip("_") or "shard"


def raw_shard_inputs(paths: list[str], location: str) -> list[ShardInput]:
    """Inputs for the raw shards of one source; two shards may not map to one key."""
    fs, _ = fsspec.core.url_to_fs(location)
    inputs, seen = [], {}
    for path in paths:
        key = shard_key(path, location)
        if key in seen:
            raise ValueError(
                f"shards {seen[key]!r} and {path!r} both map to the shard key {key!r}; rename one"
            )
        seen[key] = path
        with object_store_errors(path, "read the size and time of"):
            info = fs.info(fsspec.core.url_to_fs(path)[1])
        changed = info.get("mtime") or info.get("LastModified") or info.get("created")
        # The path too: every row names the file it came from, so a corpus moved with its file times
        # kept is read again from where it is now, not taken as done with rows naming a gone file.
        fingerprint = f"{info.get('size')}:{changed}:{path}"
        inputs.append(ShardInput(key=key, path=path, fingerprint=fingerprint))
    return inputs


def upstream_inputs(lake: Lake, stage: str, source: str) -> list[ShardInput]:
    """Inputs for a stage that reads the finished shards of `stage`, with their digests as fingerprints."""
    records = lake.records(stage, source)
    if not records:
        raise FileNotFoundError(
            f"{stage} for source {source!r} has not been materialised yet: "
            f"{lake.dataset_dir(stage, source)} holds no finished shard"
        )
    return [
        ShardInput(key=key, path=lake.shard_path(stage, source, key), fingerprint=output_digest(record))
        for key, record in records.items()
    ]


def output_digest(record: dict[str, Any]) -> str:
    """What a finished shard's output depends on: its digest, unless a later step changed the output
    without changing the input (ingest moving repeated ids to the quarantine)."""
    return record.get("output_digest", record["digest"])


def shard_digest(stage: str, params: str, shard: ShardInput) -> str:
    block = [] if shard.span is None else [f"block {shard.span[0]}-{shard.span[1]}"]
    return digest_text(stage, params, shard.key, shard.fingerprint, *block)


def digest_text(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=12).hexdigest()


def file_sizes(lake: Lake, paths: list[str]) -> dict[str, int]:
    """Bytes of each existing file of `paths`, by path below the lake root, for a completion record."""
    return {posixpath.relpath(path, lake.root): lake.fs.size(path) for path in paths if lake.fs.exists(path)}


def outputs_intact(lake: Lake, record: dict[str, Any]) -> bool:
    """Whether every file the completion record vouches for is there with its size (records written
    before they listed their files are trusted)."""
    return all(_intact(lake, relative, size) for relative, size in record.get("outputs", {}).items())


def damaged_outputs(lake: Lake, stage: str, source: str) -> tuple[list[str], int]:
    """The files (relative to the lake) that the completion records of `stage` and `source` vouch for
    but that are gone or of another size, and how many records there are."""
    records = lake.records(stage, source)
    damaged = [
        relative
        for record in records.values()
        for relative, size in record.get("outputs", {}).items()
        if not _intact(lake, relative, size)
    ]
    return sorted(damaged), len(records)


def _intact(lake: Lake, relative: str, size: int) -> bool:
    path = posixpath.join(lake.root, relative)
    return lake.fs.exists(path) and lake.fs.size(path) == size


def plan_shards(
    lake: Lake, stages: tuple[str, ...], params: str, source: str, inputs: list[ShardInput]
) -> ShardPlan:
    """Clean up after killed runs and gone inputs; return the shards to (re)do.

    `stages[0]` holds the completion records; the others are further outputs of the same shards."""
    wanted = {shard.key for shard in inputs}
    for stage in stages:
        lake.remove_temporaries(stage, source)
    records = lake.records(stages[0], source)
    present = set(records)
    for stage in stages:
        present |= lake.stored_keys(stage, source)
    removed = sorted(present - wanted)
    for key in removed:
        for stage in stages:
            lake.remove_shard(stage, source, key)
    todo, done = [], {}
    for shard in inputs:
        record = records.get(shard.key)
        if (
            record is not None
            and record.get("digest") == shard_digest(stages[0], params, shard)
            and outputs_intact(lake, record)
        ):
            done[shard.key] = record
        else:
            todo.append(shard)
    return ShardPlan(todo=todo, done=done, removed=removed)
