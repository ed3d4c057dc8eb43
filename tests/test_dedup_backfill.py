"""Backfilling one source alone keeps dedup right across sources (the reproduction of issue 11).

Two sources, `a` before `b` in priority. A new shard of `a` holds a near-copy of a document that `b`
kept. After the documented backfill (`curate_source[a]`, `dedup_clusters`, `deduplicated[a]`) the stale
`deduplicated[b]` is blocked by its check; after what Dagster's automation then launches, exactly one
copy survives. A second backfill, of `b`, stops after its signatures: automation does the rest. The kept
set is then the one a full recomputation gives.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import dagster as dg
import pytest
import yaml

from moe_dag.config import load_config
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake

SOURCES = ["a", "b"]
CURATE = ["raw_documents", "prefiltered", "minhash_signatures"]


def sentence_text(seed: int, words: int = 200) -> str:
    """Invented words in sentences and lines that pass the prefilter's quality rules (which want
    English stop words among them)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(400)]
    vocabulary += ["the", "and", "of", "to", "with"] * 8
    tokens = [rng.choice(vocabulary) for _ in range(words)]
    sentences = [" ".join(tokens[i : i + 10]).capitalize() + "." for i in range(0, words, 10)]
    return "\n".join(" ".join(sentences[i : i + 3]) for i in range(0, len(sentences), 3))


def near_copy(text: str) -> str:
    """One word in 200 changed: word-5-gram Jaccard 191 / 201 = 0.95."""
    words = text.split(" ")
    words[100] = "zzzzzz"
    return " ".join(words)


def write_shard(folder: Path, name: str, docs: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": doc_id, "text": text, "source": "test"}) for doc_id, text in docs.items()]
    (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def pipeline_config(tmp_path: Path, corpus: Path, name: str) -> Path:
    raw = {
        "lake_root": str(tmp_path / name / "lake"),
        "catalog_path": str(tmp_path / name / "catalog.duckdb"),
        "sources": [
            {"name": s, "kind": "reference", "shards": str(corpus / s), "languages": None} for s in SOURCES
        ],
        "mixture": {"seq_len": 16, "total_tokens": 1000},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def materialize(defs: dg.Definitions, instance: dg.DagsterInstance, keys: list[str], partition=None) -> None:
    dg.materialize(
        list(defs.assets) + list(defs.asset_checks or []),
        selection=keys,
        partition_key=partition,
        instance=instance,
        resources=defs.resources,
        raise_on_error=True,
    )


def run_automation(defs: dg.Definitions, instance: dg.DagsterInstance) -> list[tuple[str, str | None]]:
    """What the Dagster daemon does: evaluate the sensors and run what they request, until quiet."""
    launched = []
    while requests := [
        request for sensor in defs.sensors or [] for request in _requests(sensor, defs, instance)
    ]:
        for request in requests:
            job = defs.resolve_job_def(request.job_name)
            job.execute_in_process(instance=instance, partition_key=request.partition_key)
            launched.append((request.job_name, request.partition_key))
    return launched


def _requests(sensor, defs: dg.Definitions, instance: dg.DagsterInstance) -> list[dg.RunRequest]:
    if isinstance(sensor, dg.AutomationConditionSensorDefinition):
        return []  # declarative automation: tests/test_new_data.py evaluates it
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    return list(result.run_requests) if isinstance(result, dg.SensorResult) else []


def assert_stale_partition_is_blocked(
    defs: dg.Definitions, instance: dg.DagsterInstance, source: str
) -> None:
    """The blocking check fails on the stale partition, so the next stage does not run on its rows."""
    check = dg.AssetCheckKey(dg.AssetKey("deduplicated"), "built_from_current_clusters")
    result = dg.materialize(
        list(defs.assets) + list(defs.asset_checks or []),
        selection=dg.AssetSelection.checks(check) | dg.AssetSelection.assets("toxicity_filtered"),
        partition_key=source,
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )
    [evaluation] = result.get_asset_check_evaluations()
    assert not evaluation.passed
    assert evaluation.description.startswith(f"deduplicated[{source}] was built from clusters version")
    assert result.get_asset_materialization_events() == []  # toxicity_filtered did not run


def full_run(defs: dg.Definitions, instance: dg.DagsterInstance) -> None:
    for source in SOURCES:
        materialize(defs, instance, CURATE, source)
    materialize(defs, instance, ["dedup_clusters"])
    for source in SOURCES:
        materialize(defs, instance, ["deduplicated"], source)


def kept_ids(config_path: Path) -> set[str]:
    """Kept document ids as written in the shards (the lake namespaces them `<source>/<id>`)."""
    config = load_config(config_path)
    lake = Lake(config.lake_root)
    kept = set()
    for source in SOURCES:
        table = lake.read_table("deduplicated", source, columns=["id", "keep"])
        kept |= {id.removeprefix(f"{source}/") for id in table.filter(table["keep"])["id"].to_pylist()}
    return kept


@pytest.mark.slow
def test_backfilling_one_source_keeps_one_copy_and_equals_a_full_recomputation(tmp_path):
    corpus = tmp_path / "corpus"
    write_shard(corpus / "a", "shard-0", {f"a{i}": sentence_text(i) for i in range(3)})
    write_shard(corpus / "b", "shard-0", {f"b{i}": sentence_text(10 + i) for i in range(3)})
    config_path = pipeline_config(tmp_path, corpus, "incremental")
    defs = build_definitions(config_path)
    instance = dg.DagsterInstance.ephemeral()
    full_run(defs, instance)
    assert kept_ids(config_path) == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert run_automation(defs, instance) == []  # nothing is stale after a full run

    write_shard(corpus / "a", "shard-1", {"a9": near_copy(sentence_text(11))})  # near-copy of b1
    materialize(defs, instance, CURATE, "a")
    materialize(defs, instance, ["dedup_clusters"])
    materialize(defs, instance, ["deduplicated"], "a")
    assert "b1" in kept_ids(config_path)  # deduplicated[b] predates the new clusters: stale
    assert_stale_partition_is_blocked(defs, instance, "b")
    launched = run_automation(defs, instance)

    kept = kept_ids(config_path)
    assert "a9" in kept and "b1" not in kept  # `a` comes first in priority: its copy survives
    assert launched == [("rededuplicate_source", "b")]  # `a` was rebuilt by hand, and nothing else changed

    # A backfill of `b` that stops after its signatures: automation re-clusters, then rebuilds `b` only.
    write_shard(corpus / "b", "shard-1", {"b9": sentence_text(0).replace(".", "!")})  # a0 word for word
    materialize(defs, instance, CURATE, "b")
    assert run_automation(defs, instance) == [("recluster", None), ("rededuplicate_source", "b")]
    kept = kept_ids(config_path)
    assert "a0" in kept and "b9" not in kept

    full_path = pipeline_config(tmp_path, corpus, "full")
    full_run(build_definitions(full_path), dg.DagsterInstance.ephemeral())
    assert kept == kept_ids(full_path)
