"""What each asset declares about how it is operated, on its own decorator: its stage version, the
builder of its settings object, and whether automation or a sensor starts it.

`@dg.asset(..., metadata=operated(1, cluster_settings))` says: bump the 1 when the stage gives other
output for the same input; the asset reads the config only through `cluster_settings(config)` (for a
per-source asset `builder(config, source)`, `moe_dag/settings/`), which its body calls too. The
orchestration room turns these into code versions and automation conditions
(`moe_dag/orchestration/automation.py`) and into the order `moe-dag run` materialises stages in
(`moe_dag/orchestration/pipeline.py`), so each fact is stated once, beside the asset; the UI shows them
in the asset's metadata.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from dataclasses import dataclass
from typing import Any

import dagster as dg

from moe_dag.operations.refresh import Refresh
from moe_dag.settings.stage import SettingsBuilder

STAGE_VERSION = "moe_dag/stage_version"
SETTINGS = "moe_dag/settings"  # the settings builder, as module:name
STARTED_BY = "moe_dag/started_by"
REFRESH = "moe_dag/refresh"  # on-demand assets: {"population": asset, "threshold": config path}
AUTOMATION = "automation"

# The default condition: requested once after an upstream (partition) updates, when no upstream is
# missing or running and every blocking check on its upstreams passed.
FOLLOW_UPSTREAM = (
    dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
).with_label("follow_upstream")


def operated(
    version: int, settings: SettingsBuilder, started_by: str = AUTOMATION, refresh: Refresh | None = None
) -> dict[str, Any]:
    """Asset metadata: stage `version`, the builder of its `settings` object, what starts it
    (`automation`, or the name of the sensor that does), and for an on-demand asset the policy that says
    when new upstream data is enough to run it again (`moe_dag/operations/refresh.py`)."""
    builder = f"{settings.__module__}:{settings.__qualname__}"
    declared = {STAGE_VERSION: str(version), SETTINGS: builder, STARTED_BY: started_by}
    return declared | ({REFRESH: dataclasses.asdict(refresh)} if refresh else {})


@dataclass(frozen=True)
class Operation:
    version: str
    settings: SettingsBuilder
    started_by: str
    refresh: Refresh | None

    @property
    def automated(self) -> bool:
        return self.started_by == AUTOMATION


def operation(spec: dg.AssetSpec) -> Operation:
    """What `spec`'s asset declared with `operated` (raw or as Dagster metadata values)."""

    def declared(key: str) -> Any:
        if key not in spec.metadata:
            raise ValueError(
                f"asset {spec.key.to_user_string()} declares no {key}: use metadata=operated(...)"
            )
        value = spec.metadata[key]
        return value.value if isinstance(value, dg.MetadataValue) else value

    value = spec.metadata.get(REFRESH)
    refresh = getattr(value, "value", value)
    return Operation(
        declared(STAGE_VERSION),
        pkgutil.resolve_name(declared(SETTINGS)),
        declared(STARTED_BY),
        Refresh(**refresh) if refresh else None,
    )
