"""Every failed asset check says what failed, with its figures (issue 34, item 3).

A check result without a description shows the check spec's description in the UI and in `moe-dag run`'s
console lines, and that text describes passing: `keep_rate_on_target ... failed: the kept share is within
the calibration tolerance`. So every check result is built by `problems_result` from sentences that the
plain functions of `moe_dag/operations/bounds.py` write, and those sentences are pinned here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg

import moe_dag
from moe_dag.assets.heads import quality_heads
from moe_dag.assets.mixture import tokenized_mixture
from moe_dag.assets.reporting import WARNING_CHECKS, problems_result
from moe_dag.assets.scoring import scored_documents
from moe_dag.operations.bounds import (
    ChecksConfig,
    calibration_shortfall,
    cluster_row_violation,
    epoch_cap_shortfalls,
    ingest_reconciliation,
    keep_rate_violation,
    oracle_failure_violation,
    share_error_violations,
    stage_reconciliation,
    stale_deduplicated,
)
from moe_dag.storage.catalog import chain_breaks

PACKAGE = Path(moe_dag.__file__).parent


def check_results_built_outside_problems_result(package: Path) -> list[str]:
    """Where a module of `package` builds an AssetCheckResult other than in reporting.problems_result."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        allowed = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef) and function.name == "problems_result"
            for node in ast.walk(function)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "AssetCheckResult"
                and id(node) not in allowed
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    return found


def test_every_check_result_is_built_from_sentences_that_say_what_failed():
    assert check_results_built_outside_problems_result(PACKAGE) == []


def test_an_off_target_keep_rate_says_how_far_off_and_which_keys_set_it():
    assert keep_rate_violation("web", 16, 31, 0.7, 0.05) == (
        "scored_documents[web]: kept 16 of 31 documents (0.5161), 0.1839 from its target keep rate 0.7 "
        "(sources[web].keep_rate), beyond calibration.keep_rate_tolerance 0.05"
    )
    assert keep_rate_violation("web", 22, 31, 0.7, 0.05) is None


def test_a_stage_that_lost_rows_says_which_counts_disagree():
    assert stage_reconciliation(
        "prefiltered", "web", "raw_documents", counted=(100, 60, 39), in_files=(98, 60), upstream_kept=100
    ) == [
        "prefiltered[web]: 100 rows in but 60 kept + 39 dropped = 99",
        "prefiltered[web]: its completion records count 100 rows in, its files 98",
    ]
    assert stage_reconciliation(
        "prefiltered", "web", "raw_documents", counted=(90, 50, 40), in_files=(90, 49), upstream_kept=100
    ) == [
        "prefiltered[web]: 90 rows in but raw_documents kept 100",
        "prefiltered[web]: its completion records count 50 kept, its files 49",
    ]
    counted = (100, 60, 40)
    assert stage_reconciliation("x", "web", "y", counted=counted, in_files=(100, 60), upstream_kept=100) == []


def test_ingest_that_lost_records_says_how_many():
    assert ingest_reconciliation("web", 100, 97, 2) == [
        "raw_documents[web]: the shards held 100 records but ingest wrote 97 documents + 2 quarantined = 99"
    ]
    assert ingest_reconciliation("web", 100, 98, 2) == []


def test_an_oracle_that_failed_too_often_says_how_often_and_where_the_errors_are():
    assert oracle_failure_violation(12, 240, 0.02) == (
        "oracle_labels: 12 of 240 sampled documents left unlabelled (5.0%), above oracle.max_failure_rate "
        "2.0%; each one's error: SELECT error FROM oracle_label_failures"
    )
    assert oracle_failure_violation(4, 240, 0.02) is None


def test_clusters_without_one_row_per_document_say_their_counts():
    assert cluster_row_violation(100, 101, 100) == (
        "dedup_clusters: 100 documents signed but the clusters hold 101 rows of 100 distinct ids; each "
        "signed document needs exactly one row"
    )
    assert cluster_row_violation(100, 100, 100) is None


def test_a_stale_deduplicated_partition_names_both_versions_and_the_fix():
    assert stale_deduplicated({"web": "1-a", "code": "1-b"}, {"web": "2-a", "code": "1-b"}) == [
        "deduplicated[web] was built from clusters version 1-a but the current one is 2-a: materialise "
        "deduplicated[web] again"
    ]


def test_a_broken_stage_chain_names_the_counts():
    funnel = [("prefiltered", "web", 100, 80, 20), ("deduplicated", "web", 79, 70, 9)]
    assert "web: prefiltered kept 80 but deduplicated received 79" in chain_breaks(funnel)


def test_calibration_on_a_handful_of_unseen_documents_is_a_warning_naming_the_tolerance_key():
    assert calibration_shortfall("web", 7, 323, 0.7, 0.05, 1.96) == (
        "quality_heads[web]: thresholds calibrated on 7 unseen documents, fewer than the 323 that a keep "
        "rate within calibration.keep_rate_tolerance 0.05 needs (z = 1.96): on new documents its keep "
        "rate may be 0.339 off its target; calibration.keep_rate_tolerance: 0.339 accepts that, or the "
        "source needs more documents than the oracle labels (oracle.per_source)"
    )
    assert calibration_shortfall("web", 0, 323, 0.7, 0.05, 1.96) == (
        "quality_heads[web]: no unseen documents to calibrate on, so no thresholds and it cannot be "
        "scored: the source needs more documents than the oracle labels (oracle.per_source)"
    )
    assert calibration_shortfall("web", 323, 323, 0.7, 0.05, 1.96) is None


def test_a_source_at_its_epoch_cap_is_a_warning_naming_the_cap_and_the_weight():
    shares = {
        "small": {"capped": True, "short": True, "achieved_share": 0.014, "target_share": 0.05},
        "big": {"capped": False, "short": False, "achieved_share": 0.986, "target_share": 0.95},
    }
    assert epoch_cap_shortfalls(shares, 4) == [
        "tokenized_mixture: source 'small' is at its cap of 4 epochs and trains at 0.0140 of the mixture "
        "against its target 0.0500: raise mixture.max_epochs, lower sources[small].mixture_weight, or "
        "give the source more documents"
    ]


def test_a_share_off_target_names_the_weight_that_sets_it():
    shares = {"prose": {"achieved_share": 0.46, "target_share": 0.5}}
    assert share_error_violations(shares, ChecksConfig(max_share_error=0.02)) == [
        "source 'prose': achieved share 0.4600 against target 0.5000 (error 0.0400 > checks.max_share_error "
        "0.02); sources[prose].mixture_weight sets the target"
    ]


def test_small_sample_findings_are_warnings_not_errors():
    result = problems_result("keep_rate_on_target", ["x"])
    assert (result.passed, result.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert problems_result("rows_reconcile", ["x"]).severity == dg.AssetCheckSeverity.ERROR
    specs = {
        spec.name: spec.blocking
        for asset in (quality_heads, tokenized_mixture, scored_documents)
        for spec in asset.check_specs
    }
    warned = {
        "calibrated_on_enough_documents",
        "sources_within_epoch_cap",
        "target_shares_met",
        "keep_rate_on_target",
    }
    assert {name: specs[name] for name in warned} == dict.fromkeys(warned, False)
    assert set(WARNING_CHECKS) == warned
