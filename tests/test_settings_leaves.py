"""Issue 31: each stage reads the config only through its settings object, and a change to any config
leaf makes exactly the stages that read it stale (their code version, or a source's own version).

The test walks every leaf of configs/demo.yaml's loaded `PipelineConfig`, changes it alone, and compares
the versions Dagster is given (`code_version`, `source_config_version`) with `READ_BY`: which stages read
the leaf, by the longest matching key prefix, or why no stage does.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from moe_dag.assets.operating import operation
from moe_dag.config import load_config
from moe_dag.orchestration.automation import code_version, source_config_version
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.quality.heads.backbone import default_model_path
from moe_dag.settings.stage import builds_per_source

DEMO = "configs/demo.yaml"
SEARCH = {
    "mixture_candidates",
    "candidate_proxy",
    "mixture_proposal",
    "mixture_validation",
    "mixture_search_report",
}
MIXTURES = {"tokenizer", "tokenized_mixture", "unfiltered_mixture"} | SEARCH
SOURCE_LIST = {
    "dedup_clusters",
    "oracle_sample",
    "oracle_labels",
    "quality_heads",
    "neutral_documents",
} | MIXTURES
FILTERS = {"prefiltered", "toxicity_filtered"}

# Why a leaf is read by no stage.
READ_BY_NONE = {
    "path": "the config file's own location",
    "lake_root": "where outputs are kept, not what a stage computes",
    "catalog_path": "where the catalog and the shard ledger are kept",
    "demo_corpus": "read by `moe-dag demo-corpus`; the corpus reaches the stages as shards",
    "ray": "where the data stages run: the same outputs on any cluster",
    "refresh": "when `moe-dag run` lets on-demand assets follow new data, not what they compute",
    "comparisons": "which assets `moe-dag run` materialises",
    "object_store": "how long a call to an object store may wait: the same outputs, or a failure",
}
# Leaves derived at load from others: changed through those.
DERIVED = {
    "mixture.weights": "the sources' mixture_weight",
    "training.resolved": "the training preset and overrides (tests/test_training_preset_identity.py)",
}
READ_BY: dict[str, set[str]] = {
    "sources[].name": SOURCE_LIST,  # also the partition key of every per-source asset
    "sources[].kind": FILTERS | {"oracle_labels", "quality_heads"},
    "sources[].shards": {"raw_documents"},
    "sources[].languages": {"prefiltered", "oracle_sample"},
    "sources[].keep_rate": {"oracle_sample", "quality_heads", "scored_documents"},
    "sources[].mixture_weight": MIXTURES,
    "sources[].prefilter": {"prefiltered"},
    "sources[].toxicity": {"toxicity_filtered"},
    "prefilter": {"prefiltered"},
    "toxicity": {"toxicity_filtered"},
    "dedup": {"minhash_signatures", "dedup_clusters"},
    "oracle": {"oracle_labels"},
    "oracle.per_source": {"oracle_sample"},
    "oracle.seed": {"oracle_sample"},
    "backbone": {"quality_heads", "scored_documents"},
    "heads": {"quality_heads"},
    "calibration": {"oracle_sample", "quality_heads"},
    "calibration.keep_rate_tolerance": {"oracle_sample", "quality_heads", "scored_documents"},
    "tokenizer": {"tokenizer"},
    "mixture": MIXTURES,
    "mixture.seq_len": MIXTURES | {"evaluation_sets"},
    "mixture.eos_token": MIXTURES | {"evaluation_sets"},
    "training": {"moe_proxy", "curation_gain", "moe_gain"} | SEARCH,
    "checks.max_drop_share": FILTERS,
    "checks.max_drop_share_by_source": FILTERS,
    "checks.min_duplicate_share": {"deduplicated"},
    "checks.max_duplicate_share": {"deduplicated"},
    "checks.min_head_f1": {"quality_heads"},
    "checks.max_share_error": {"tokenized_mixture"},
    "checks.loss_window_fraction": {"moe_proxy"},
    "checks.min_loss_drop_fraction": {"moe_proxy"},
    "checks.max_expert_load_over_mean": {"moe_proxy"},
    "checks.min_language_documents": FILTERS | {"deduplicated", "scored_documents"},
    "evaluation": {"evaluation_sets", "proxy_eval", "curation_gain", "moe_gain"} | SEARCH,
    "evaluation.neutral_share": {
        "neutral_documents",
        "evaluation_sets",
        "proxy_eval",
        "curation_gain",
        "moe_gain",
    }
    | SEARCH,
    "mixture_search": SEARCH,
}


def leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths (field names and list indexes) to every leaf: a value neither a dataclass nor a list of them."""
    if dataclasses.is_dataclass(value):
        return [
            leaf
            for f in dataclasses.fields(value)
            for leaf in leaves(getattr(value, f.name), (*path, f.name))
        ]
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return [leaf for index, item in enumerate(value) for leaf in leaves(item, (*path, index))]
    return [path]


def key(path: tuple) -> str:
    return ".".join("[]" if isinstance(part, int) else part for part in path).replace(".[]", "[]")


# Leaves whose changed value must be picked: a preset that exists, an endpoint and overrides that parse,
# a bound for a configured source, and a language list turned on or off (oracle_sample reads whether
# language ID runs, not which languages).
CHANGES = {
    "training.preset": lambda value: "tiny",
    "training.rdzv_endpoint": lambda value: "node0:29500",
    "tokenizer.from_": lambda value: str(default_model_path()),  # a folder holding a tokenizer.json
    "training.overrides": lambda value: {**value, "optim.warmup_steps": 31},
    "sources[].languages": lambda value: None if value is not None else ["en"],
    "checks.max_drop_share_by_source": lambda value: {
        **value,
        "code": {"default": 0.9},
    },  # a configured source
}


def changed(leaf: str, value: Any) -> Any:
    if leaf in CHANGES:
        return CHANGES[leaf](value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, Path):
        return value.with_name("changed.yaml")
    if isinstance(value, (list, tuple)):
        return type(value)([*value, "changed"])
    if isinstance(value, dict):
        return {**value, "changed": {"default": 0.9}}
    assert value is None, value
    return ["en"]


def with_leaf_changed(config: Any, path: tuple) -> Any:
    """A copy of `config` with the leaf at `path` changed, and what load derives from it derived again."""
    config = copy.deepcopy(config)
    *parents, name = path
    owner = config
    for part in parents:
        owner = owner[part] if isinstance(part, int) else getattr(owner, part)
    object.__setattr__(owner, name, changed(key(path), getattr(owner, name)))  # frozen sections too
    config.mixture.weights = {source.name: source.mixture_weight for source in config.sources}
    config.training = dataclasses.replace(config.training)  # resolves the preset with the change
    return config


def versions(specs: list, config: Any) -> dict[tuple[str, str | None], str]:
    found = {}
    for spec in specs:
        asset = spec.key.to_user_string()
        found[asset, None] = code_version(spec, config)
        if builds_per_source(operation(spec).settings):
            found |= {(asset, s): source_config_version(spec, config, s) for s in config.source_names}
    return found


DEFINITIONS = build_definitions(DEMO)
SPECS = [spec for asset in DEFINITIONS.assets for spec in asset.specs]
CONFIG = load_config(DEMO)
LEAVES = [path for path in leaves(CONFIG) if not any(key(path).startswith(d) for d in DERIVED)]


def readers(leaf: str) -> set[str] | str:
    """The stages `READ_BY` says read `leaf` (its longest listed prefix), or why none does."""
    prefixes = [p for p in (*READ_BY, *READ_BY_NONE) if leaf == p or leaf.startswith((p + ".", p + "["))]
    assert prefixes, f"{leaf} is read by no stage and not listed in READ_BY_NONE with a reason"
    longest = max(prefixes, key=len)
    return READ_BY.get(longest, READ_BY_NONE.get(longest, ""))


@pytest.mark.parametrize("path", LEAVES, ids=[".".join(map(str, p)) for p in LEAVES])
def test_changing_a_leaf_makes_exactly_the_stages_that_read_it_stale(path):
    before = versions(SPECS, CONFIG)
    after = versions(SPECS, with_leaf_changed(CONFIG, path))
    stale = {
        asset
        for where, version in before.items()
        if after.get(where, version) != version
        for asset in [where[0]]
    }
    expected = readers(key(path))
    assert stale == (expected if isinstance(expected, set) else set())


def test_every_stage_reads_some_leaf_or_nothing_by_design():
    read = set().union(*READ_BY.values())
    assets = {spec.key.to_user_string() for spec in SPECS}
    assert assets - read == {"document_catalog"}  # its views cover every stage whatever the settings
