"""The works a worker process has built, kept for the shards and stage runs that follow.

A Ray worker process outlives its task: Ray keeps about one per CPU and hands it this driver's next
task, whatever its function. So a process that once built a warm stage's work (`StageSpec.warm`: a
language ID model, a classifier, a backbone) keeps it, and a later shard of the same stage, in this
stage run or a later one (the next materialisation, a new shard), uses it as it is.

Works are keyed by the spec's digest (`spec_key`: its factory with their arguments, its params, its
outputs; pickled once by the driver), so a work is reused only for the very spec that built it. By
the engine's contract the params hold everything the work reads when it is built (the heads' version,
the fit's), so a key names one work. A few are kept per process, the least recently used going first.
Other work sent to these processes keeps what it loaded the same way (`kept`: the prefilter fit's
filters, curation/fits.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from moe_dag.engine.stage import ShardWork, StageSpec

# Warm works kept per process. One source's materialisation uses up to 3 (prefilter with language ID,
# toxicity, scoring), so 8 keep the last two or three sources' works: a new shard's run finds them. The
# demo's largest model, the scoring backbone, is loaded once per process for every source (stages.py).
KEPT_WORKS = 8

_KEPT: OrderedDict[str, Any] = OrderedDict()
T = TypeVar("T")


def spec_key(spec: StageSpec) -> str:
    """A digest of everything in the spec, `make_work`'s arguments included (by cloudpickle, which also
    carries a work class defined in a script)."""
    from ray import cloudpickle

    return hashlib.blake2b(cloudpickle.dumps(spec), digest_size=16).hexdigest()


def kept(key: str, build: Callable[[], T]) -> T:
    """What this process keeps under `key`, built by `build` on first use; the least recently used of
    more than KEPT_WORKS goes."""
    if key not in _KEPT:
        _KEPT[key] = build()
        while len(_KEPT) > KEPT_WORKS:
            _KEPT.popitem(last=False)
    _KEPT.move_to_end(key)
    return _KEPT[key]


def warm_work(key: str | None, boxed_spec: list[Any]) -> tuple[StageSpec, ShardWork]:
    """The spec and its work: kept in this process under `key` (a warm spec's `spec_key`), built on
    first use; with no key, built for this one shard. `boxed_spec` holds the spec's object ref in a
    list, so that Ray does not fetch and unpickle the spec for calls that find the work here."""

    def build() -> tuple[StageSpec, ShardWork]:
        import ray

        spec = ray.get(boxed_spec[0])
        return spec, spec.make_work()

    return build() if key is None else kept(key, build)
