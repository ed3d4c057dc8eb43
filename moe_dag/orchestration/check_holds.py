"""Blocking checks that hold across runs: what depends on an asset whose blocking check failed does not
run, in this run or a later one, until that asset is materialised again and the check passes.

Dagster's own blocking applies within one run (the run fails at the check) and to declarative
automation (`all_deps_blocking_checks_passed`). `moe-dag run` launches a run per stage and partition, so
it asks the instance before each: the latest evaluation of every blocking check on the upstreams it
would read, for the partitions it would read them in. A change that fixes the cause (the data, the
stage's config, or the check's own bounds, which are part of the checked asset's code version) makes
the upstream stale; it reruns first, its check is evaluated again, and the hold lifts when it passes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from moe_dag.assets.dagster_internals import latest_check_evaluations

SHOWN_CHARS = 300  # per metadata value in a console line: enough for the figures, not a whole table


@dataclass(frozen=True)
class FailedCheck:
    asset: str
    partition: str | None
    check: str
    description: str  # what the evaluation said failed, else what the check tests
    figures: dict[str, str]

    def describe(self) -> str:
        where = self.asset + (f"[{self.partition}]" if self.partition else "")
        figures = ", ".join(f"{name}: {value}" for name, value in self.figures.items())
        return f"check {self.check} on {where} failed: {self.description}" + (
            f" ({figures})" if figures else ""
        )


class HeldByCheck(RuntimeError):
    """Blocking checks failed: their downstream waits until each checked asset passes again."""

    def __init__(self, failed: Sequence[FailedCheck]):
        self.failed = list(failed)
        assets = sorted({f.asset + (f"[{f.partition}]" if f.partition else "") for f in failed})
        super().__init__(
            "\n".join(f"- {check.describe()}" for check in failed)
            + f"\nWhat depends on {', '.join(assets)} waits until it is materialised again and its blocking "
            "checks pass: change what the check names (the data, the stage's config, or the check's bounds "
            "under `checks:`), then run again; the changed asset reruns first."
        )


class CheckHolds:
    """The blocking checks of `definitions`, asked of `instance` for the partitions a stage reads."""

    def __init__(self, instance: dg.DagsterInstance, definitions: dg.Definitions, sources: Sequence[str]):
        self.instance, self.sources = instance, list(sources)
        self.graph = definitions.resolve_asset_graph()
        checked = [*definitions.assets, *(definitions.asset_checks or [])]
        self.specs = {spec.key: spec for definition in checked for spec in definition.check_specs}
        self.blocking: dict[dg.AssetKey, list[dg.AssetCheckKey]] = defaultdict(list)
        for key, spec in self.specs.items():
            if spec.blocking:
                self.blocking[spec.asset_key].append(key)

    def failed(self, asset: dg.AssetKey, partition: str | None) -> list[FailedCheck]:
        """The blocking checks on `asset` (`partition`) whose latest evaluation failed."""
        checks = self.blocking.get(asset, [])
        latest = latest_check_evaluations(self.instance, checks, partition) if checks else {}
        return [
            self.describe(evaluation, partition) for evaluation in latest.values() if not evaluation.passed
        ]

    def describe(self, evaluation: dg.AssetCheckEvaluation, partition: str | None) -> FailedCheck:
        """A check's evaluation with what it said failed (else what the check tests) and its figures."""
        spec = self.specs.get(dg.AssetCheckKey(evaluation.asset_key, evaluation.check_name))
        description = evaluation.description or (spec.description if spec else None) or ""
        values = {name: getattr(value, "value", value) for name, value in evaluation.metadata.items()}
        return FailedCheck(
            asset=evaluation.asset_key.to_user_string(),
            partition=partition,
            check=evaluation.check_name,
            description=description,
            # a list of the sentences the description already joins is not said twice
            figures={
                name: str(value)[:SHOWN_CHARS]
                for name, value in values.items()
                if not (isinstance(value, list) and value and all(str(v) in description for v in value))
            },
        )

    def holding(self, todo: Sequence[str], partition: str | None) -> list[FailedCheck]:
        """Failed blocking checks on what `todo` (run for `partition`) reads and does not itself redo."""
        redone = {dg.AssetKey(key) for key in todo}
        upstreams = {parent for key in redone for parent in self.graph.get(key).parent_keys} - redone
        failed = []
        for upstream in sorted(upstreams, key=lambda key: key.to_user_string()):
            if not self.graph.get(upstream).is_partitioned:
                failed += self.failed(upstream, None)
            else:
                for source in [partition] if partition is not None else self.sources:
                    failed += self.failed(upstream, source)
        return failed
