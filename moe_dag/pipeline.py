"""Materialise the whole graph in process, stage by stage: what `make demo` and the end-to-end test run.

Per-source stages run once per partition; global stages (dedup clustering, heads, mixture, training)
run once after every source has reached them. In the UI the same order comes from the asset graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dagster as dg

from moe_dag.definitions import build_definitions
from moe_dag.instance_health import free_dead_runs, pool_holders

# Step events stay in the instance (and the UI); the console shows what the assets log themselves.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}

# Two more training runs: skipped when the config says `comparisons: false`.
COMPARISONS = ["unfiltered_mixture", "curation_gain", "moe_gain"]
# (assets, per source?) in dependency order.
STAGES: list[tuple[list[str], bool]] = [
    (["raw_documents", "prefiltered", "minhash_signatures"], True),
    (["dedup_clusters"], False),
    (["deduplicated", "toxicity_filtered"], True),
    (["oracle_sample", "oracle_labels", "quality_heads"], False),
    (["scored_documents"], True),
    (["document_catalog", "tokenizer", "tokenized_mixture", "moe_proxy", "proxy_eval"], False),
    (COMPARISONS, False),
]


def materialize_all(
    config_path: str, instance: dg.DagsterInstance | None = None, log: Callable[[str], None] = print
) -> float:
    """Run every asset for every source; raises on the first failed run. Returns wall seconds."""
    definitions = build_definitions(config_path)
    config = definitions.resources["pipeline"].config
    assets = list(definitions.assets) + list(definitions.asset_checks or [])  # runs include their checks
    graph = definitions.resolve_asset_graph()
    started = time.perf_counter()
    for keys, per_source in STAGES:
        if keys is COMPARISONS and not config.comparisons:
            log(f"{', '.join(keys)}: skipped (comparisons: false in {config.path})")
            continue
        pools = set().union(*(graph.get(dg.AssetKey(key)).pools or set() for key in keys))
        for partition in config.source_names if per_source else [None]:
            if instance is not None and pools:
                _report_pool_waits(instance, pools, log)
            stage_started = time.perf_counter()
            result = dg.materialize(
                assets,
                selection=keys,
                partition_key=partition,
                instance=instance,
                resources=definitions.resources,
                run_config=QUIET_CONSOLE,
                raise_on_error=True,
            )
            # A failed blocking check has already failed the run; the others are worth a look.
            for check in result.get_asset_check_evaluations():
                if not check.passed:
                    log(f"warning: check {check.check_name} on {check.asset_key.to_user_string()} failed")
            where = f" [{partition}]" if partition else ""
            log(f"{', '.join(keys)}{where}: {time.perf_counter() - stage_started:.1f}s")
    return time.perf_counter() - started


def _report_pool_waits(instance: dg.DagsterInstance, pools: set[str], log: Callable[[str], None]) -> None:
    """Free what dead runs hold, then say which live run a stage is about to wait for."""
    for line in free_dead_runs(instance):
        log(f"freed: {line}")
    for holder in pool_holders(instance, pools):
        log(f"waiting: {holder.describe()}; the stage starts when it ends (or: moe-dag free-stuck-runs)")
