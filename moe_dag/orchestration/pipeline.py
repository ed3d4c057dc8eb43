"""Materialise the graph in process, stage by stage: what `moe-dag run`, `make demo` and the end-to-end
test run.

Per-source stages run once per partition; global stages (dedup clustering, heads, mixture, training)
run once after every source has reached them; the stages are derived from the asset graph (`stages`).
Only what is missing or stale runs (`moe_dag/orchestration/staleness.py`): on an unchanged lake nothing
does, and the heads do not retrain. Every run is tagged with the config version and, per source, the source.

Why this is not Dagster's own: `dagster asset materialize` runs a fixed selection in one run whatever is
stale, and declarative automation needs a running daemon and sensor ticks, so `moe-dag run` is the
daemon-less, in-process loop that asks Dagster's stale status (through `staleness.py`) before each stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from moe_dag.assets.dagster_internals import DagsterAssetCheckFailedError
from moe_dag.orchestration.automation import run_tags, source_config_tags
from moe_dag.orchestration.check_holds import CheckHolds, FailedCheck, HeldByCheck
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.instance_health import free_dead_runs, pool_holders
from moe_dag.orchestration.staleness import Staleness

# Step events stay in the instance (and the UI); the console shows what the assets log themselves.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}

# The group of the baselines' training runs, which `comparisons: false` skips.
COMPARISONS = "comparisons"
# The mixture search runs only when asked (`moe-dag search-mixture`): never a stage of `moe-dag run`.
MIXTURE_SEARCH = "mixture_search"


@dataclass(frozen=True)
class Stage:
    """Assets materialised together, in dependency order: per source (one run per partition), or once."""

    assets: list[str]
    per_source: bool
    comparisons: bool = False  # the baselines' training runs, skipped unless asked for


def stages(definitions: dg.Definitions) -> list[Stage]:
    """The graph's assets as alternating stages of per-source and global assets, derived from the asset
    definitions: a stage takes every asset whose upstreams are done and whose partitioning matches, in
    definition order, until none is left. The comparisons group comes after everything else; the mixture
    search group is never a stage (`moe-dag search-mixture` runs it)."""
    graph = definitions.resolve_asset_graph()
    nodes = [graph.get(spec.key) for asset in definitions.assets for spec in asset.specs]
    nodes = [node for node in nodes if node.group_name != MIXTURE_SEARCH]
    done: set[dg.AssetKey] = set()
    result: list[Stage] = []
    for comparisons in (False, True):
        group = [node for node in nodes if (node.group_name == COMPARISONS) == comparisons]
        per_source, idle = True, 0
        while any(node.key not in done for node in group):
            stage = _take_ready(group, done, per_source)
            idle = 0 if stage else idle + 1
            if idle == 2:
                raise ValueError(f"assets wait on upstreams outside the graph: {[n.key for n in group]}")
            if stage:
                result.append(Stage(stage, per_source, comparisons))
            per_source = not per_source
    return result


def _take_ready(nodes: list, done: set[dg.AssetKey], per_source: bool) -> list[str]:
    """Every node partitioned as `per_source` says whose upstreams are `done`, repeatedly; marks them done."""
    taken: list[str] = []
    ready = [node for node in nodes if node.key not in done]
    while ready := [n for n in ready if n.is_partitioned == per_source and n.parent_keys <= done]:
        done.update(node.key for node in ready)
        taken += [node.key.to_user_string() for node in ready]
        ready = [node for node in nodes if node.key not in done]
    return taken


class UnknownSourceError(ValueError):
    """A source asked for that the config does not name."""


@dataclass
class PipelineRun:
    seconds: float
    launched: list[tuple[str, str | None]] = field(default_factory=list)  # (asset, partition) materialised
    up_to_date: set[str] = field(default_factory=set)  # assets with at least one partition left as it was
    # Refreshes a policy found due that wait for `--refresh`, each said as `Staleness.waiting` says it.
    waiting_for_refresh: list[str] = field(default_factory=list)


def materialize_all(
    config_path: str,
    instance: dg.DagsterInstance | None = None,
    log: Callable[[str], None] = print,
    *,
    force: bool = False,
    sources: list[str] | None = None,
    comparisons: bool | None = None,
    refresh: bool = False,
) -> PipelineRun:
    """Materialise what is missing or stale (everything with `force`), stage by stage; raises on the first
    failed run, except a failed blocking check of one source's stage: the other sources go on to the
    end of that stage, then `HeldByCheck` stops the run (and later runs, until the check passes; see
    `check_holds.py`). `sources` limits the per-source stages to those partitions (a backfill of one source);
    with `force`, the per-source stages of those sources are redone and the global ones run when stale.
    `comparisons` overrides the config's `comparisons` (whether the baselines train). `refresh` runs the
    on-demand stages (labels and heads, mixture and training) on any new data, not only as their refresh
    policy says (`moe_dag/operations/refresh.py`); without it, a relabelling the policy finds due waits:
    the run says what it would redo and goes on with the current heads.

    Staleness needs the instance's history: without `instance`, one ephemeral instance serves the call."""
    definitions = build_definitions(config_path)
    config = definitions.resources["pipeline"].config
    unknown = sorted(set(sources or []) - set(config.source_names))
    if unknown:
        raise UnknownSourceError(
            f"no source named {unknown} in {config_path}; sources: {config.source_names}"
        )
    instance = instance or dg.DagsterInstance.ephemeral()
    assets = list(definitions.assets) + list(definitions.asset_checks or [])  # runs include their checks
    graph = definitions.resolve_asset_graph()
    launched_by = "moe-dag run" + (" --force" if force else "") + (" --source" if sources else "")
    holds = CheckHolds(instance, definitions, config.source_names)
    held: list[FailedCheck] = []
    run = PipelineRun(seconds=0.0)
    started = time.perf_counter()
    for stage in stages(definitions):
        keys, per_source = stage.assets, stage.per_source
        if stage.comparisons and not (config.comparisons if comparisons is None else comparisons):
            log(f"{', '.join(keys)}: skipped (comparisons: false in {config.path}; --comparisons runs them)")
            continue
        if held and not per_source:
            raise HeldByCheck(held)
        pools = set().union(*(graph.get(dg.AssetKey(key)).pools or set() for key in keys))
        forced = force and (per_source or not sources)  # a backfill of sources redoes only theirs
        for partition in (sources or config.source_names) if per_source else [None]:
            where = f" [{partition}]" if partition else ""
            staleness = Staleness(instance, definitions, config, refresh=refresh)
            todo = keys if forced else _needs_run(keys, partition, staleness, definitions, log)
            for notice in staleness.waiting.values():
                log(notice)
                run.waiting_for_refresh.append(notice)
            run.up_to_date |= set(keys) - set(todo)
            holding = holds.holding(todo, partition) if todo else []
            if holding:
                log(f"{', '.join(todo)}{where}: held by a failed blocking check upstream")
            if not todo or holding:
                held += holding
                continue
            if pools:
                _report_pool_waits(instance, pools, log)
            stage_started = time.perf_counter()
            try:
                result = dg.materialize(
                    assets,
                    selection=todo,
                    partition_key=partition,
                    instance=instance,
                    resources=definitions.resources,
                    run_config=QUIET_CONSOLE,
                    tags=run_tags(config, launched_by, partition)
                    | (source_config_tags(definitions.assets, config, partition) if partition else {})
                    | staleness.population_tags(todo),
                    raise_on_error=True,
                )
            except DagsterAssetCheckFailedError:
                failed = [check for key in todo for check in holds.failed(dg.AssetKey(key), partition)]
                if not per_source:
                    raise HeldByCheck(failed) from None
                log(f"{', '.join(todo)}{where}: stopped by a failed blocking check")
                held += failed
                continue
            run.launched += [(key, partition) for key in todo]
            # A failed blocking check has failed the run above; the others are worth a look.
            for check in result.get_asset_check_evaluations():
                if not check.passed:
                    log(f"warning: {holds.describe(check, partition).describe()}")
            log(f"{', '.join(todo)}{where}: {time.perf_counter() - stage_started:.1f}s")
    if held:
        raise HeldByCheck(held)
    run.seconds = time.perf_counter() - started
    if run.up_to_date and not run.launched:
        log(f"up to date: {len(run.up_to_date)} assets, nothing to materialise (--force redoes them all)")
    return run


def _needs_run(
    keys: list[str],
    partition: str | None,
    staleness: Staleness,
    definitions: dg.Definitions,
    log: Callable[[str], None],
) -> list[str]:
    """The `keys` that are missing or stale, and those downstream of them within the stage."""
    graph = definitions.resolve_asset_graph()
    todo: list[str] = []
    for key in keys:
        if graph.get(dg.AssetKey(key)).parent_keys & {dg.AssetKey(done) for done in todo}:
            todo.append(key)
        elif (reason := staleness.reason(key, partition)) is not None:
            log(f"{key}{f' [{partition}]' if partition else ''}: {reason}")
            todo.append(key)
    return todo


def _report_pool_waits(instance: dg.DagsterInstance, pools: set[str], log: Callable[[str], None]) -> None:
    """Free what dead runs hold, then say which live run a stage is about to wait for."""
    for line in free_dead_runs(instance):
        log(f"freed: {line}")
    for holder in pool_holders(instance, pools):
        log(f"waiting: {holder.describe()}; the stage starts when it ends (or: moe-dag free-stuck-runs)")
