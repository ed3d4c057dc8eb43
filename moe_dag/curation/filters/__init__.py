"""Document filters: each adds score columns and a keep/reason decision, never deleting a row."""

from moe_dag.curation.filters.base import (
    DocumentFilter,
    FilterCounts,
    FilterStats,
    fit_to_source,
    run_filters,
)
from moe_dag.curation.filters.prefilter import PrefilterConfig, build_prefilters
from moe_dag.curation.filters.toxicity import ToxicityConfig, build_toxicity_filters

__all__ = [
    "DocumentFilter",
    "FilterCounts",
    "FilterStats",
    "PrefilterConfig",
    "ToxicityConfig",
    "build_prefilters",
    "build_toxicity_filters",
    "fit_to_source",
    "run_filters",
]
