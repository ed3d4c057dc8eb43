"""New data and reruns: a new shard starts its source and only its source; staleness; idempotent reruns.

Two tiny sources `a` and `b` (the corpus of tests/test_dedup_backfill.py), the curation stages only:
raw_documents -> prefiltered -> minhash_signatures -> dedup_clusters -> deduplicated -> toxicity_filtered.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import dagster as dg
import pytest
from test_dedup_backfill import SOURCES, pipeline_config, sentence_text, write_shard

from moe_dag.cli import main as cli
from moe_dag.config import load_config
from moe_dag.orchestration import pipeline
from moe_dag.orchestration.automation import TAG_CONFIG_VERSION, TAG_NEW_SHARDS, TAG_SOURCE, config_version
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.staleness import Staleness

PER_SOURCE = ["raw_documents", "prefiltered", "minhash_signatures"]
AFTER_CLUSTERS = ["deduplicated", "toxicity_filtered"]
CURATION = [*PER_SOURCE, "dedup_clusters", *AFTER_CLUSTERS]


def materialize(defs, instance, keys, partition=None, tags=None) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        list(defs.assets) + list(defs.asset_checks or []),
        selection=keys,
        partition_key=partition,
        instance=instance,
        resources=defs.resources,
        tags=tags,
        raise_on_error=True,
    )


def curate_everything(defs, instance) -> None:
    for source in SOURCES:
        materialize(defs, instance, PER_SOURCE, source)
    materialize(defs, instance, ["dedup_clusters"])
    for source in SOURCES:
        materialize(defs, instance, AFTER_CLUSTERS, source)


def sensor_requests(defs, instance) -> list[dg.RunRequest]:
    """The requests of every sensor but the automation sensor (evaluated by `automation_requests`)."""
    requests = []
    for sensor in defs.sensors:
        if isinstance(sensor, dg.AutomationConditionSensorDefinition):
            continue
        result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        if isinstance(result, dg.RunRequest):
            requests.append(result)
        elif isinstance(result, dg.SensorResult):
            requests += result.run_requests or []
    return requests


class Daemon:
    """What the Dagster daemon does with the sensors on: evaluate the sensors and the automation
    conditions of the curation assets, run what they request, until nothing is requested. It keeps the
    automation cursor from tick to tick, as the daemon does (a first evaluation requests nothing)."""

    def __init__(self, defs: dg.Definitions, instance: dg.DagsterInstance) -> None:
        self.defs, self.instance, self.cursor = defs, instance, None

    def run(self) -> list[tuple[str, str | None]]:
        launched = []
        while ran := self._tick():
            launched += ran
        return launched

    def _tick(self) -> list[tuple[str, str | None]]:
        defs, instance, ran = self.defs, self.instance, []
        for request in sensor_requests(defs, instance):
            if request.job_name:
                job = defs.resolve_job_def(request.job_name)
                keys = sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys)
            else:  # the new-shards sensors target raw_documents
                keys = ["raw_documents"]
            materialize(defs, instance, keys, request.partition_key, request.tags)
            ran += [(key, request.partition_key) for key in keys]
        result = dg.evaluate_automation_conditions(
            defs, instance, asset_selection=dg.AssetSelection.assets(*CURATION), cursor=self.cursor
        )
        self.cursor = result.cursor
        for key in CURATION:
            for partition in sorted(result.get_requested_partitions(dg.AssetKey(key)), key=str):
                materialize(defs, instance, [key], partition)
                ran.append((key, partition))
        return ran


def lake_contents(config_path: Path, source: str) -> dict[str, str]:
    """sha256 of every file of `source` in the lake; completion records without their timings (seconds
    per shard and per filter)."""
    lake = Path(load_config(config_path).lake_root)
    contents = {}
    for path in sorted(lake.glob(f"*/source={source}/**/*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if path.parent.name == "_done":
            data = json.dumps(without_timings(json.loads(data)), sort_keys=True).encode()
        contents[str(path.relative_to(lake))] = hashlib.sha256(data).hexdigest()
    return contents


def raw_data_version(instance: dg.DagsterInstance, source: str) -> str:
    record = instance.get_latest_data_version_record(dg.AssetKey("raw_documents"), partition_key=source)
    return record.asset_materialization.tags["dagster/data_version"]


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "seconds"}
    return value


@pytest.fixture
def curated(tmp_path, local_ray):
    corpus = tmp_path / "corpus"
    write_shard(corpus / "a", "shard-0", {f"a{i}": sentence_text(i) for i in range(3)})
    write_shard(corpus / "b", "shard-0", {f"b{i}": sentence_text(10 + i) for i in range(3)})
    config_path = pipeline_config(tmp_path, corpus, "pipeline")
    defs = build_definitions(config_path)
    instance = dg.DagsterInstance.ephemeral()
    curate_everything(defs, instance)
    return corpus, config_path, defs, instance


@pytest.mark.slow
def test_a_new_shard_runs_its_source_then_its_downstream_partitions_only(curated):
    corpus, config_path, defs, instance = curated
    daemon = Daemon(defs, instance)
    assert daemon.run() == []  # every shard is in the ledger: nothing new

    write_shard(corpus / "a", "shard-1", {"a9": sentence_text(99)})
    [request] = sensor_requests(defs, instance)
    assert request.partition_key == "a"
    assert request.tags[TAG_SOURCE] == "a" and request.tags[TAG_CONFIG_VERSION] == config_version(config_path)
    assert request.tags[TAG_NEW_SHARDS] == f'["{corpus / "a" / "shard-1.jsonl"}"]'

    launched = daemon.run()
    assert launched[0] == ("raw_documents", "a")
    assert set(launched) == {
        ("raw_documents", "a"),
        ("prefiltered", "a"),
        ("minhash_signatures", "a"),
        ("dedup_clusters", None),  # the dedup_consistency sensor re-clusters after new signatures
        ("deduplicated", "a"),
        ("toxicity_filtered", "a"),
    }
    run = instance.get_run_by_id(
        instance.get_latest_materialization_event(dg.AssetKey("raw_documents")).run_id
    )
    assert run.tags[TAG_SOURCE] == "a" and TAG_NEW_SHARDS in run.tags
    assert daemon.run() == []  # ingested once


@pytest.mark.slow
def test_staleness_follows_new_shards_and_config_and_a_source_backfill_is_byte_identical(
    curated, monkeypatch
):
    corpus, config_path, defs, instance = curated
    curation = [
        pipeline.Stage(PER_SOURCE, per_source=True),
        pipeline.Stage(["dedup_clusters"], per_source=False),
        pipeline.Stage(AFTER_CLUSTERS, per_source=True),
    ]
    monkeypatch.setattr(pipeline, "stages", lambda definitions: curation)

    def reasons(definitions=defs) -> dict[tuple[str, str | None], str]:
        staleness = Staleness(instance, definitions, load_config(config_path))
        found = {}
        for key in CURATION:
            for partition in [None] if key == "dedup_clusters" else SOURCES:
                reason = staleness.reason(key, partition)
                if reason is not None:
                    found[(key, partition)] = reason
        return found

    assert reasons() == {}
    write_shard(corpus / "a", "shard-1", {"a9": sentence_text(99)})
    assert reasons() == {("raw_documents", "a"): "shards: 1 new, 0 changed, 0 removed shards"}
    materialize(defs, instance, ["raw_documents"], "a")
    assert list(reasons()) == [("prefiltered", "a")]  # stale: raw_documents[a] has a new data version

    # `moe-dag run` runs what is stale, in order; then nothing. Its runs carry the source and config.
    said = []
    run = pipeline.materialize_all(str(config_path), instance=instance, log=said.append)
    assert run.launched == [
        ("prefiltered", "a"),
        ("minhash_signatures", "a"),
        ("dedup_clusters", None),
        ("deduplicated", "a"),
        ("toxicity_filtered", "a"),
    ]
    latest = instance.get_latest_materialization_event(dg.AssetKey("toxicity_filtered")).run_id
    tags = instance.get_run_by_id(latest).tags
    assert tags[TAG_SOURCE] == "a" and tags[TAG_CONFIG_VERSION] == config_version(config_path)
    assert pipeline.materialize_all(str(config_path), instance=instance, log=said.append).launched == []
    assert said[-1].startswith("up to date: 6 assets")

    # Backfilling one source from nothing (`moe-dag run --source a --force`) gives the same files, byte
    # for byte (the completion records' timings aside), and the same data version; dedup_clusters, whose
    # inputs' data versions did not change, does not run.
    before, version = lake_contents(config_path, "a"), raw_data_version(instance, "a")
    for stage in Path(load_config(config_path).lake_root).iterdir():
        shutil.rmtree(stage / "source=a", ignore_errors=True)
    run = pipeline.materialize_all(
        str(config_path), instance=instance, log=said.append, force=True, sources=["a"]
    )
    assert run.launched == [(key, "a") for key in PER_SOURCE + AFTER_CLUSTERS]
    assert lake_contents(config_path, "a") == before and len(before) > 10
    assert raw_data_version(instance, "a") == version
    assert reasons() == {}

    # A config change makes the stages that read it stale, and nothing else.
    text = config_path.read_text() + "dedup:\n  jaccard_threshold: 0.7\n"
    config_path.write_text(text)
    stale = reasons(build_definitions(config_path))
    assert set(stale) == {("minhash_signatures", "a"), ("minhash_signatures", "b"), ("dedup_clusters", None)}
    assert all("code version" in reason for reason in stale.values())


def test_backfilling_an_unknown_source_names_the_sources(tmp_path):
    config_path = pipeline_config(tmp_path, tmp_path / "corpus", "pipeline")
    with pytest.raises(SystemExit, match=r"no source named \['zz'\].*sources: \['a', 'b'\]"):
        cli.main(["--config", str(config_path), "run", "--source", "zz"])
