"""The asset checks that can fail: each made to fail by the fault it guards against, and passing without it.

Stage checks run by materialising the asset on a small lake with its checks; checks of expensive assets
(heads, training) are tested through the functions that compute their results.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from moe_dag.assets.training_runs import LOSS_FALLING, ROUTER_HEALTHY, training_check_results
from moe_dag.config import load_config
from moe_dag.curation.counts import count_shard_lines, slice_counts
from moe_dag.mixture import MixtureConfig, build_mixture
from moe_dag.mixture.tokenizer import TokenizerConfig, train_tokenizer
from moe_dag.operations.bounds import (
    ChecksConfig,
    drop_share_violations,
    duplicate_share_violation,
    emptied_source,
    head_agreement_violations,
    share_error_violations,
)
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake
from moe_dag.storage.readers import read_shard
from tests.test_dedup_backfill import sentence_text, write_shard


def pipeline_config(tmp_path: Path, checks: dict | None = None, **source: object) -> Path:
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [
            {
                "name": "web",
                "kind": "reference",
                "shards": str(tmp_path / "corpus"),
                "languages": None,
                **source,
            }
        ],
        "mixture": {"seq_len": 16, "total_tokens": 1000},
    }
    if checks is not None:
        raw["checks"] = checks
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def write_corpus(tmp_path: Path) -> None:
    """Two shards: ten clean documents, two too short for the prefilter, a blank line and a bad line."""
    folder = tmp_path / "corpus"
    write_shard(folder, "a", {f"a{i}": sentence_text(i) for i in range(10)})
    short = "\n".join(json.dumps({"id": f"b{i}", "text": "Too short."}) for i in range(2))
    (folder / "b.jsonl").write_text(f"{short}\n\n{{not json\n")


def materialize(
    config_path: Path, keys: list[str], instance: dg.DagsterInstance | None = None
) -> dg.ExecuteInProcessResult:
    defs = build_definitions(str(config_path))
    return dg.materialize(
        list(defs.assets) + list(defs.asset_checks or []),
        selection=keys,
        partition_key="web",
        resources=defs.resources,
        instance=instance or dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def checks_of(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {c.check_name: c for c in result.get_asset_check_evaluations()}


def problems(check: dg.AssetCheckEvaluation) -> list[str]:
    return check.metadata["problems"].value


# Reconciliation against an independent count -----------------------------------------------------


def test_line_count_agrees_with_the_reader_on_awkward_shards(tmp_path):
    records = [json.dumps({"id": str(i), "text": f"document {i}"}) for i in range(5)]
    body = (
        records[0] + "\r\n\r\n" + records[1] + "\r" + records[2] + records[3] + "\n" + records[4]
    ).encode()
    plain, packed, cut = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.jsonl.gz"
    plain.write_bytes(body)
    packed.write_bytes(gzip.compress(body))
    cut.write_bytes(gzip.compress(body * 50)[:-40])  # a stream cut short
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["one", "two"]}), parquet)
    for path in (plain, packed, cut, parquet):
        result = read_shard(str(path), "s")
        lines = {*result.documents["line"].to_pylist(), *result.quarantine["line"].to_pylist()}
        assert count_shard_lines(str(path)) == len(lines), path.name


def test_raw_documents_fails_when_a_shard_loses_rows_its_records_still_count(tmp_path, local_ray):
    write_corpus(tmp_path)
    config_path = pipeline_config(tmp_path)
    first = checks_of(materialize(config_path, ["raw_documents"]))
    assert first["lines_in_shards"].passed and first["rows_reconcile"].passed

    # A row lost after ingest counted it, with the completion record brought in line with the damaged file
    # (a file of another size than its record says is redone: tests/faults/test_completion_records.py).
    lake = Lake(tmp_path / "lake")
    path = lake.shard_path("raw_documents", "web", "a")
    lake.write_file(lake.read_file(path).slice(1), path)
    record = lake.read_record("raw_documents", "web", "a")
    record["outputs"] = {name: lake.fs.size(f"{lake.root}/{name}") for name in record["outputs"]}
    lake.write_record("raw_documents", "web", "a", record)
    again = checks_of(materialize(config_path, ["raw_documents"]))
    assert again["rows_reconcile"].passed  # the same-pass count cannot see it
    assert not again["lines_in_shards"].passed
    assert problems(again["lines_in_shards"]) == [
        f"{tmp_path / 'corpus' / 'a.jsonl'}: 10 lines in the file, 9 in the lake"
    ]


def test_a_stage_whose_input_lost_rows_fails_its_reconciliation(tmp_path, local_ray):
    write_corpus(tmp_path)
    config_path = pipeline_config(tmp_path)
    first = checks_of(materialize(config_path, ["raw_documents", "prefiltered"]))
    assert first["rows_reconcile"].passed
    assert [c.passed for c in first.values()].count(False) == 0

    # raw_documents loses a row after prefiltered read it: the completion records of both still agree.
    lake = Lake(tmp_path / "lake")
    path = lake.shard_path("raw_documents", "web", "a")
    lake.write_file(lake.read_file(path).slice(1), path)
    assert slice_counts(lake, "raw_documents", "web") == (11, 11)
    again = checks_of(materialize(config_path, ["prefiltered"]))
    assert not again["rows_reconcile"].passed
    metadata = again["rows_reconcile"].metadata
    assert (metadata["rows_in"].value, metadata["rows_in_files"].value) == (12, 12)
    assert metadata["kept_by_raw_documents"].value == 11


# Drop-rate bounds and emptied sources -------------------------------------------------------------


def test_prefilter_drop_share_fails_naming_reason_source_and_share(tmp_path, local_ray):
    write_corpus(tmp_path)
    result = checks_of(
        materialize(
            pipeline_config(tmp_path, {"max_drop_share": {"default": 0.1}}), ["raw_documents", "prefiltered"]
        )
    )
    check = result["drop_share_per_reason"]
    assert not check.passed
    (problem,) = problems(check)
    assert problem.startswith(
        "prefiltered[web]: reason 'gopher_too_few_words' (sources[web].prefilter.gopher_quality.min_words = "
        "50) dropped 2 of 12 documents (16.7%)"
    )
    assert result["source_not_emptied"].passed


def test_drop_share_bound_per_source_overrides_the_default():
    config = ChecksConfig(
        max_drop_share={"default": 0.1, "lang": 0.3}, max_drop_share_by_source={"web": {"lang": 0.9}}
    )
    assert drop_share_violations("prefiltered", "web", {"lang": 8, "short": 1}, 10, config) == []
    (found,) = drop_share_violations("prefiltered", "code", {"lang": 4, "short": 1}, 10, config)
    assert (
        "prefiltered[code]: reason 'lang' dropped 4 of 10 documents (40.0%), above its bound 30.0%" in found
    )
    # Naming one reason keeps the default bound for the others.
    only_lang = ChecksConfig(max_drop_share={"lang": 0.9})
    (found,) = drop_share_violations("toxicity_filtered", "web", {"toxic": 6}, 10, only_lang)
    assert "above its bound 50.0%" in found


def test_a_source_that_loses_every_document_stops_at_that_stage_with_the_reasons(tmp_path, local_ray):
    write_corpus(tmp_path)
    config_path = pipeline_config(tmp_path, prefilter={"gopher_quality": {"min_words": 100_000}})
    instance = dg.DagsterInstance.ephemeral()
    result = materialize(config_path, ["raw_documents", "prefiltered", "minhash_signatures"], instance)
    check = checks_of(result)["source_not_emptied"]
    assert not check.passed
    (problem,) = problems(check)
    assert problem.startswith(
        "source 'web' lost every document at prefiltered (12 in; top reasons: gopher_too_few_words 12 "
        "(sources[web].prefilter.gopher_quality.min_words = 100000))"
    )
    assert "To keep it: lower sources[web].prefilter.gopher_quality.min_words (100000 now)" in problem
    logged = instance.all_logs(result.dagster_run.run_id)
    assert any(entry.user_message == problem and entry.level == logging.WARNING for entry in logged)
    # Blocking: the stage after it does not run on the remnant.
    assert not result.success
    assert not Lake(tmp_path / "lake").has_table("minhash_signatures", "web")


def test_emptied_source_is_none_while_something_is_kept():
    assert emptied_source("prefiltered", "web", {"short": 3}, 4, 1) is None
    assert emptied_source("prefiltered", "web", {}, 0, 0) is None  # no input: nothing was lost here


def test_the_mixture_refuses_a_source_that_kept_no_documents(tmp_path):
    texts = [sentence_text(i, 40) for i in range(30)]
    documents = {
        "web": pa.table({"id": [f"web/{i}" for i in range(30)], "text": texts}),
        "social": pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
    }
    tokenizer = train_tokenizer(iter(texts), TokenizerConfig(vocab_size=300))
    config = MixtureConfig(weights={"web": 1.0, "social": 1.0}, seq_len=8, heldout_min_documents=2)
    with pytest.raises(ValueError, match=r"sources \['social'\] kept no documents.*remove it from sources"):
        build_mixture(documents, tokenizer, config, tmp_path)


# Dedup rate bounds -------------------------------------------------------------------------------


def test_duplicate_share_outside_its_bounds_fails():
    config = ChecksConfig(min_duplicate_share=0.01, max_duplicate_share=0.5)
    assert duplicate_share_violation("web", 100, 10, config) is None
    assert (
        "0 of 100 documents removed as duplicates (0.0%), outside [1.0%, 50.0%]"
        in duplicate_share_violation("web", 100, 0, config)
    )
    assert "(90.0%)" in duplicate_share_violation("web", 100, 90, config)


def test_deduplicated_checks_its_duplicate_share(tmp_path, local_ray):
    folder = tmp_path / "corpus"
    texts = {f"a{i}": sentence_text(i) for i in range(6)}
    write_shard(folder, "a", {**texts, **{f"copy{i}": texts[f"a{i}"] for i in range(3)}})
    stages = ["raw_documents", "prefiltered", "minhash_signatures", "dedup_clusters", "deduplicated"]
    defs = build_definitions(str(pipeline_config(tmp_path, {"max_duplicate_share": 0.2})))
    instance = dg.DagsterInstance.ephemeral()
    everything = list(defs.assets) + list(defs.asset_checks or [])
    kwargs = {"resources": defs.resources, "instance": instance, "raise_on_error": False}
    dg.materialize(everything, selection=stages[:3], partition_key="web", **kwargs)
    dg.materialize(everything, selection=stages[3:4], **kwargs)
    result = dg.materialize(everything, selection=stages[4:], partition_key="web", **kwargs)
    check = checks_of(result)["duplicate_share_in_bounds"]
    assert not check.passed
    assert check.metadata["duplicate_share"].value == round(3 / 9, 4)
    assert "outside [0.0%, 20.0%]" in problems(check)[0]
    assert checks_of(result)["rows_reconcile"].passed


# Heads, mixture, training ------------------------------------------------------------------------


def test_head_agreement_under_the_floor_fails_per_head():
    config = ChecksConfig(min_head_f1=0.7)
    assert head_agreement_violations({"probe_f1": 0.8, "judge_f1": 0.75}, config) == []
    (found,) = head_agreement_violations({"probe_f1": 0.57, "judge_f1": 0.75}, config)
    assert found.startswith("probe head: keep-decision F1 vs the oracle 0.57")
    assert len(head_agreement_violations({"probe_f1": math.nan, "judge_f1": 0.75}, config)) == 1


def test_share_error_beyond_the_tolerance_fails():
    shares = {
        "code": {"target_share": 0.3, "achieved_share": 0.301},
        "prose": {"target_share": 0.5, "achieved_share": 0.46},
    }
    (found,) = share_error_violations(shares, ChecksConfig(max_share_error=0.02))
    assert found.startswith("source 'prose': achieved share 0.4600 against target 0.5000 (error 0.0400")
    assert share_error_violations(shares, ChecksConfig(max_share_error=0.05)) == []


def router(dead: list[int], ratio: list[float]) -> dict:
    return {"layers": [1, 3], "dead_experts": dead, "max_over_mean": ratio}


def write_metrics(run_dir: Path, losses: list[float], last_router: dict) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [
        {"step": i + 1, "loss": loss, "router": router([0, 0], [1.2, 1.3])} for i, loss in enumerate(losses)
    ]
    records[-1]["router"] = last_router
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.mark.parametrize(
    ("losses", "problem"),
    [
        (list(np.linspace(8.0, 5.0, 40)), None),
        ([8.0] * 20 + [math.nan] + [6.0] * 19, "1 non-finite losses, the first at logged step 21"),
        ([8.0, 7.9] * 20, "the loss did not fall: mean 7.9500 over the last 4 steps against 7.9500"),
    ],
)
def test_training_loss_must_be_finite_and_falling(tmp_path, losses, problem):
    results = training_check_results(
        write_metrics(tmp_path, losses, router([0, 0], [1.1, 1.2])), ChecksConfig()
    )
    check = {r.check_name: r for r in results}[LOSS_FALLING]
    assert check.passed is (problem is None)
    if problem:
        assert check.metadata["problems"].value[0].startswith(problem)


def test_router_health_fails_on_dead_experts_and_overload(tmp_path):
    falling = list(np.linspace(8.0, 5.0, 20))
    healthy = training_check_results(
        write_metrics(tmp_path / "a", falling, router([0, 0], [1.1, 1.9])), ChecksConfig()
    )
    assert {r.check_name: r.passed for r in healthy} == {LOSS_FALLING: True, ROUTER_HEALTHY: True}
    sick = training_check_results(
        write_metrics(tmp_path / "b", falling, router([2, 0], [1.1, 3.5])), ChecksConfig()
    )
    check = {r.check_name: r for r in sick}[ROUTER_HEALTHY]
    assert not check.passed
    assert check.metadata["problems"].value == [
        "layer 1: 2 dead experts (no token in the health window)",
        "layer 3: max expert load 3.50x the mean, above checks.max_expert_load_over_mean 2.0",
    ]


# Config -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checks", "message"),
    [
        ({"max_drop_share": {"default": 1.5}}, "checks.max_drop_share.default must lie between 0 and 1"),
        ({"max_drop_share_by_source": {"nope": {"lang": 0.5}}}, r"unknown source\(s\) \['nope'\]"),
        ({"min_duplicate_share": 0.6, "max_duplicate_share": 0.5}, "is above max_duplicate_share"),
        ({"max_expert_load_over_mean": 0.5}, "must be at least 1"),
        ({"min_head_f1": "high"}, "checks.min_head_f1: expected float, got str 'high'"),
        ({"max_share_eror": 0.1}, "checks.max_share_eror: unknown key; did you mean 'max_share_error'"),
    ],
)
def test_check_bounds_are_validated_at_load(tmp_path, checks, message):
    with pytest.raises(ValueError, match=message):
        load_config(pipeline_config(tmp_path, checks))


def test_slice_counts_read_the_keep_column(tmp_path):
    lake = Lake(tmp_path)
    lake.write_table(pa.table({"id": ["a", "b", "c"], "keep": [True, False, True]}), "stage", "s")
    assert slice_counts(lake, "stage", "s") == (3, 2)
    lake.write_table(pa.table({"id": ["a", "b"]}), "raw", "s")
    assert slice_counts(lake, "raw", "s") == (2, 2)


def test_every_check_in_the_operating_table_is_declared_with_its_blocking_flag():
    graph = build_definitions("configs/demo.yaml").resolve_asset_graph()
    declared = {(k.asset_key.to_user_string(), k.name): graph.get(k).blocking for k in graph.asset_check_keys}
    table = Path("docs/operating.md").read_text().split("## Checks", 1)[1].split("\n## ", 1)[0]
    documented, previous = {}, ""
    for row in table.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) == 4 and cells[1].startswith("`"):
            assets = cells[0].replace("the same four", previous) if "the same four" in cells[0] else cells[0]
            previous = assets
            for asset in assets.split(","):
                documented[(asset.strip(" `"), cells[1].strip("`"))] = cells[2] == "yes"
    assert documented == declared
