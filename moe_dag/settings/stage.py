"""What a stage's settings object is made of, and the digests taken of it.

A settings object is a frozen dataclass whose fields are everything the stage reads of the config. Two
marks on a field say how a change to it reaches Dagster and the lake:

- `per_source()`: the field is one source's own setting. A per-source asset's code version leaves it
  out, so that one source's settings do not make every source's partition stale; it goes into the
  partition's own version (`source_digest`) instead.
- `bound()`: the field bounds a check on the stage's output rather than shaping its rows. It is in the
  versions (a changed bound rechecks the asset) but not in the work digest, so the shards, and a stored
  fit, are not redone for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

PER_SOURCE = "moe_dag/per_source"
BOUND = "moe_dag/bound"


def per_source(*, is_bound: bool = False) -> Any:
    """A field that holds one source's own setting (and, with `is_bound`, bounds a check)."""
    return dataclasses.field(metadata={PER_SOURCE: True, BOUND: is_bound})


def bound() -> Any:
    """A field that bounds a check on the stage's output, shared by every source."""
    return dataclasses.field(metadata={PER_SOURCE: False, BOUND: True})


def _digest(settings: Any, keep: Callable[[dataclasses.Field], bool]) -> str:
    values = [(f.name, getattr(settings, f.name)) for f in dataclasses.fields(settings) if keep(f)]
    return hashlib.blake2b(repr(values).encode(), digest_size=6).hexdigest()


def shared_digest(settings: Any) -> str:
    """What every partition of the stage reads: the input of the asset's code version."""
    return _digest(settings, lambda f: not f.metadata.get(PER_SOURCE, False))


def source_digest(settings: Any) -> str:
    """What the stage reads of one source's own settings: the partition's version."""
    return _digest(settings, lambda f: f.metadata.get(PER_SOURCE, False))


def work_digest(settings: Any) -> str:
    """Everything that shapes the stage's rows (bounds left out): stored fits and shard digests."""
    return _digest(settings, lambda f: not f.metadata.get(BOUND, False))


# `builder(config)` for a global stage, `builder(config, source)` for a per-source one.
SettingsBuilder = Callable[..., Any]


def builds_per_source(builder: SettingsBuilder) -> bool:
    """Whether `builder` builds one source's settings (it takes the source's name)."""
    return "source" in inspect.signature(builder).parameters
