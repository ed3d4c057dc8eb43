"""Issue 35, item 4: a stage output deleted (or cut) after its run is not "up to date": whoever decides
what to run (`moe-dag run`, through `Staleness`) checks the completion records against the files they
vouch for, names the damaged file, and the rerun redoes that shard alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_new_data import CURATION, SOURCES, curated  # noqa: F401 - `curated` is a fixture

from moe_dag.config import load_config
from moe_dag.orchestration import pipeline
from moe_dag.orchestration.staleness import Staleness

pytestmark = pytest.mark.slow  # the curation stages of two sources, materialised


def reasons(instance, defs, config_path) -> dict[tuple[str, str | None], str]:
    staleness = Staleness(instance, defs, load_config(config_path))
    found = {}
    for key in CURATION:
        for partition in [None] if key == "dedup_clusters" else SOURCES:
            if (reason := staleness.reason(key, partition)) is not None:
                found[(key, partition)] = reason
    return found


def test_a_deleted_stage_output_makes_its_partition_need_a_run(curated, monkeypatch):  # noqa: F811
    _, config_path, defs, instance = curated
    assert reasons(instance, defs, config_path) == {}
    lake = Path(load_config(config_path).lake_root)
    [output] = (lake / "toxicity_filtered" / "source=b").glob("*.parquet")
    output.unlink()
    assert reasons(instance, defs, config_path) == {
        ("toxicity_filtered", "b"): (
            f"damaged: toxicity_filtered/source=b/{output.name} is missing or changed since its run "
            "recorded it (1 of 1 shards)"
        )
    }

    # `moe-dag run` redoes that partition (its shard alone), and then nothing is left to do.
    curation = [
        pipeline.Stage(["raw_documents", "prefiltered", "minhash_signatures"], per_source=True),
        pipeline.Stage(["dedup_clusters"], per_source=False),
        pipeline.Stage(["deduplicated", "toxicity_filtered"], per_source=True),
    ]
    monkeypatch.setattr(pipeline, "stages", lambda definitions: curation)
    run = pipeline.materialize_all(str(config_path), instance=instance, log=lambda line: None)
    assert run.launched == [("toxicity_filtered", "b")]
    assert output.exists()
    assert reasons(instance, defs, config_path) == {}


def test_a_cut_stage_output_makes_its_partition_need_a_run(curated):  # noqa: F811
    _, config_path, defs, instance = curated
    lake = Path(load_config(config_path).lake_root)
    [output] = (lake / "prefiltered" / "source=a").glob("*.parquet")
    output.write_bytes(output.read_bytes()[:100])
    found = reasons(instance, defs, config_path)
    assert found[("prefiltered", "a")].startswith(f"damaged: prefiltered/source=a/{output.name} is missing")
