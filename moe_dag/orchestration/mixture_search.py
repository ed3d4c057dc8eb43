"""`moe-dag search-mixture`: the mixture search job, materialised in order, its candidates concurrently.

The candidates are partitions of one asset, and Dagster materialises one partition per run; here each
runs in its own process (`parallel` at once, the `proxy_swarm` pool's limit set to match), recorded in
the same instance, so the UI shows each candidate's run and a failed one can be rerun alone. The rest
of the job (candidates, regression, validation, report) runs in this process, in dependency order.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import dagster as dg

from moe_dag.assets.mixture_search import CANDIDATES, POOL
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.pipeline import QUIET_CONSOLE


def _materialize(
    config_path: str, instance: dg.DagsterInstance, keys: list[str], partition: str | None = None
) -> None:
    definitions = build_definitions(config_path)
    dg.materialize(
        list(definitions.assets) + list(definitions.asset_checks or []),
        selection=keys,
        partition_key=partition,
        instance=instance,
        resources=definitions.resources,
        run_config=QUIET_CONSOLE,
        tags={"moe_dag/launched_by": "moe-dag search-mixture"},
        raise_on_error=True,
    )


def open_instance(home: str | None) -> dg.DagsterInstance:
    """The instance at $DAGSTER_HOME (`home` None), or the one kept in the folder `home`."""
    return dg.DagsterInstance.get() if home is None else dg.DagsterInstance.local_temp(home)


def _candidate_in_process(config_path: str, home: str | None, key: str) -> str:
    with open_instance(home) as instance:
        _materialize(config_path, instance, ["candidate_proxy"], key)
    return key


def search_mixture(config_path: str, home: str | None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole search, recorded in `open_instance(home)`; returns the validation's figures."""
    config = build_definitions(config_path).resources["pipeline"].config
    parallel = config.mixture_search.parallel
    with open_instance(home) as instance:
        _materialize(config_path, instance, ["mixture_candidates"])
        keys = instance.get_dynamic_partitions(CANDIDATES.name)
        instance.event_log_storage.set_concurrency_slots(POOL, parallel)
    log(f"mixture search: {len(keys)} proxies (candidates and the configured mixture), {parallel} at a time")
    context = multiprocessing.get_context("spawn")  # a clean process per candidate, as a run launcher gives
    with ProcessPoolExecutor(parallel, mp_context=context) as pool:
        futures = [pool.submit(_candidate_in_process, config_path, home, key) for key in keys]
        for future in futures:
            log(f"candidate_proxy [{future.result()}]: done")
    with open_instance(home) as instance:
        _materialize(
            config_path, instance, ["mixture_proposal", "mixture_validation", "mixture_search_report"]
        )
    folder = build_definitions(config_path).resources["pipeline"].lake.artifact_dir("mixture_search")
    log((folder / "proposal.yaml").read_text())
    return json.loads((folder / "validation.json").read_text())
