"""Label a sample through the cache: pay only for what was never labelled, keep what was paid for.

    report = label_documents(requests, oracle, LabelCache(lake), LabellingConfig())

Requests whose (text hash, rubric, prompt version, model) is in the cache are answered from it.
Identical texts are asked once. The rest go to the oracle, and its labels are committed to the cache
every `commit_every` labels as they arrive (and whatever is left when the run stops, even on an
error), so a killed run resumes where it stopped. A document the oracle could not label is reported
with its error and raw replies and left unlabelled; the run goes on, unless `max_consecutive_failures`
documents fail in a row, which means the oracle is down rather than the documents bad.

Every request ends in exactly one of the report's two tables: labels or failures.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from tqdm import tqdm

from moe_dag.quality.oracle.base import (
    LabelRequest,
    LabelResult,
    Oracle,
    OracleError,
    OracleLabel,
    failures_to_table,
    labels_to_table,
    make_label,
)
from moe_dag.quality.oracle.cache import CacheKey, LabelCache, text_hash
from moe_dag.quality.oracle.rubrics import PROMPT_VERSION


@dataclass(kw_only=True)
class LabellingConfig:
    commit_every: int = 64  # labels per cache batch: what a killed run can lose at most
    max_consecutive_failures: int = 64
    compact_above: int = 256  # cache files before they are merged into one

    def __post_init__(self) -> None:
        if min(self.commit_every, self.max_consecutive_failures, self.compact_above) < 1:
            raise ValueError(
                "commit_every, max_consecutive_failures and compact_above must be >= 1, got "
                f"{self.commit_every}, {self.max_consecutive_failures}, {self.compact_above}"
            )


@dataclass
class LabellingReport:
    labels: pa.Table  # LABEL_SCHEMA plus text_hash, in request order
    failures: pa.Table  # FAILURE_SCHEMA
    from_cache: int  # requests answered by labels paid for in earlier runs
    newly_labelled: int  # labels paid for in this run

    @property
    def requested(self) -> int:
        return self.labels.num_rows + self.failures.num_rows

    @property
    def failure_rate(self) -> float:
        return self.failures.num_rows / self.requested if self.requested else 0.0


def label_documents(
    requests: Sequence[LabelRequest], oracle: Oracle, cache: LabelCache, config: LabellingConfig
) -> LabellingReport:
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"label_documents: document id {duplicate!r} is requested more than once")
    model = oracle.model_name
    cache.remove_temporaries()
    keys: list[CacheKey] = [(text_hash(r.text), r.rubric) for r in requests]
    known = cache.lookup(keys, model, PROMPT_VERSION)
    from_cache = sum(key in known for key in keys)
    todo: dict[CacheKey, LabelRequest] = {}
    for request, key in zip(requests, keys, strict=True):
        if key not in known:
            todo.setdefault(key, request)

    key_of = {request.id: key for key, request in todo.items()}
    failed: dict[CacheKey, LabelResult] = {}
    batch: list[tuple[str, OracleLabel]] = []
    in_a_row = 0
    try:
        results = oracle.label(list(todo.values()))
        for result in tqdm(results, total=len(todo), desc=f"oracle {model}", disable=None):
            key = key_of[result.request.id]
            if result.label is None:
                failed[key] = result
                in_a_row += 1
                if in_a_row >= config.max_consecutive_failures:
                    raise OracleError(
                        f"{in_a_row} documents in a row got no label, the last with: {result.error}; "
                        "stopping (labels so far are committed, a rerun resumes from them)"
                    )
                continue
            in_a_row = 0
            known[key] = json.dumps(result.label.scores, sort_keys=True)
            batch.append((key[0], result.label))
            if len(batch) >= config.commit_every:
                cache.commit(batch)
                batch = []
    finally:
        cache.commit(batch)
    cache.compact(config.compact_above)

    labels, failures = [], []
    for request, key in zip(requests, keys, strict=True):
        if key in known:
            labels.append(make_label(request, json.loads(known[key]), model))
        else:  # a duplicate of a failed text shares its failure
            failure = failed[key]
            failures.append(
                LabelResult(request, error=failure.error, replies=failure.replies, attempts=failure.attempts)
            )
    label_table = labels_to_table(labels)
    hashes = [key[0] for key in keys if key in known]
    label_table = label_table.append_column("text_hash", pa.array(hashes, pa.string()))
    return LabellingReport(
        labels=label_table,
        failures=failures_to_table(failures, model),
        from_cache=from_cache,
        newly_labelled=len(todo) - len(failed),
    )
