"""Adding a shard to one source, then the incremental path (the source's curation, the clusters, and
what the dedup sensors rebuild), gives the clusters and decisions of a full recomputation given the same
arrivals, row for row (issue 21: incremental dedup of new shards against the signatures already
clustered), and changes no decision of the source's old documents, though the new ids sort first."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_dedup_backfill import (
    CURATE,
    SOURCES,
    full_run,
    materialize,
    near_copy,
    pipeline_config,
    run_automation,
    sentence_text,
    write_shard,
)

from moe_dag.config import load_config
from moe_dag.curation.dedup.partitioned import ARRIVAL_FILE
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake

CLUSTER_COLUMNS = ["id", "source", "cluster_id", "is_survivor", "duplicate_of", "match", "jaccard"]


def lake_tables(config_path) -> dict[str, pa.Table]:
    lake = Lake(load_config(config_path).lake_root)
    tables = {"dedup_clusters": lake.read_table("dedup_clusters", columns=CLUSTER_COLUMNS).sort_by("id")}
    for source in SOURCES:
        deduplicated = lake.read_table("deduplicated", source, columns=["id", "keep", "reason"])
        tables[f"deduplicated[{source}]"] = deduplicated.sort_by("id")
    return tables


@pytest.mark.slow
def test_a_shard_added_to_one_source_equals_a_full_recomputation(tmp_path):
    corpus = tmp_path / "corpus"
    write_shard(corpus / "a", "shard-0", {f"a{i}": sentence_text(i) for i in range(4)})
    write_shard(corpus / "b", "shard-0", {f"b{i}": sentence_text(10 + i) for i in range(4)})
    config_path = pipeline_config(tmp_path, corpus, "incremental")
    defs = build_definitions(config_path)
    instance = dg.DagsterInstance.ephemeral()
    full_run(defs, instance)
    before = lake_tables(config_path)

    # The new shard: a near-copy of a document of the other source, an exact one with its spacing
    # changed, a near-copy of an old document of its own source, and a document new to both; their
    # ids sort before the old ones ('0' < 'a'), so only their arrival says they came later.
    new = {
        "0-a10": near_copy(sentence_text(11)),
        "0-a11": sentence_text(12).replace(". ", ".  "),
        "0-a12": near_copy(sentence_text(0)),
        "0-a13": sentence_text(40),
    }
    write_shard(corpus / "a", "shard-1", new)
    materialize(defs, instance, CURATE, "a")
    materialize(defs, instance, ["dedup_clusters"])
    materialize(defs, instance, ["deduplicated"], "a")
    # Only the new shard's cluster rows changed, so only it was deduplicated again: the old shard's
    # file, and what reads it downstream, stays as it was.
    event = instance.get_latest_materialization_event(dg.AssetKey("deduplicated"))
    assert event.asset_materialization.metadata["shards_run"].value == 1
    assert run_automation(defs, instance) == [("rededuplicate_source", "b")]
    incremental = lake_tables(config_path)

    # A fresh lake given the arrivals the incremental lake recorded (shard-1 after the rest).
    full_path = pipeline_config(tmp_path, corpus, "full")
    arrivals = Lake(load_config(config_path).lake_root).dataset_dir("dedup_clusters") + f"/{ARRIVAL_FILE}"
    fresh = Path(Lake(load_config(full_path).lake_root).dataset_dir("dedup_clusters"))
    fresh.mkdir(parents=True)
    shutil.copy(arrivals, fresh / ARRIVAL_FILE)
    full_run(build_definitions(full_path), dg.DagsterInstance.ephemeral())
    recomputed = lake_tables(full_path)
    for name, table in recomputed.items():
        assert incremental[name].equals(table), name
    # Source a comes first in priority, so its new copies outlive b's documents; within a, the document
    # that arrived first survives whatever the ids, and every old document of a keeps its decision.
    clusters = incremental["dedup_clusters"].to_pylist()
    duplicate_of = {row["id"]: row["duplicate_of"] for row in clusters if not row["is_survivor"]}
    assert {k.split("/")[-1]: v.split("/")[-1] for k, v in duplicate_of.items()} == {
        "b1": "0-a10",
        "b2": "0-a11",
        "0-a12": "a0",
    }
    old = before["deduplicated[a]"]
    assert (
        incremental["deduplicated[a]"]
        .filter(pc.is_in(incremental["deduplicated[a]"]["id"], old["id"]))
        .equals(old)
    )
