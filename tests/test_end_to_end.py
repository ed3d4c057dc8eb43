"""Materialise the whole graph in process on a tiny demo corpus, then query what it left behind."""

import json
import math
from pathlib import Path

import dagster as dg
import pytest

from moe_dag.cli import main as cli
from moe_dag.cli.summary import NOISE_SQL, format_summary
from moe_dag.config import DEFAULT_CONFIG, load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.pipeline import materialize_all, stages
from tests.pipeline_configs import Replace, demo_config


def tiny_config(tmp_path: Path) -> Path:
    """configs/demo.yaml (same sources, hence the same partitions) shrunk to run in a few minutes."""
    shards = {
        name: {"shards": str(tmp_path / "corpus" / name)} for name in load_config(DEFAULT_CONFIG).source_names
    }
    changes = {
        "demo_corpus": {"docs_per_source": 60, "seed": 0, "docs_per_shard": 25},
        "sources": shards,
        "oracle": {"per_source": 30},
        "heads": {"epochs": 3},
        "tokenizer": {"vocab_size": 512},
        "mixture": {
            "seq_len": 64,
            "total_tokens": 20_000,
            "heldout_fraction": 0.2,
            "heldout_min_documents": 5,
        },
        "training": Replace(preset="tiny", steps=12, seed=0),
        # About 18 held-out labels: a head's keep F1 moves by ~0.1 with two labels (0.67 for the probe here).
        "checks": {"min_head_f1": 0.5},
    }
    return demo_config(tmp_path, changes, "tiny.yaml")


@pytest.mark.slow
def test_whole_graph_materialises_and_every_row_is_accounted_for(tmp_path, capsys, local_ray):
    config_path = tiny_config(tmp_path)
    config = load_config(config_path)
    manifest = build_demo_corpus(tmp_path / "corpus", config.demo_corpus)

    instance = dg.DagsterInstance.ephemeral()
    materialize_all(str(config_path), instance=instance, log=lambda _: None)

    con_rows = dict(
        ((stage, source), (rows_in, kept))
        for stage, source, rows_in, kept, _ in _query(config, "SELECT * FROM stage_funnel")
    )
    for source in config.source_names:
        raw_in = con_rows[("raw_documents", source)][0]
        quarantined = _query(config, f"SELECT count(*) FROM quarantine WHERE source = '{source}'")[0][0]
        assert raw_in + quarantined == manifest["lines"][source]
        assert 0 < con_rows[("scored_documents", source)][1] < raw_in
    assert _query(config, "SELECT count(*) FROM quarantine")[0][0] == manifest["malformed_lines"]

    reasons = {row[0] for row in _query(config, "SELECT DISTINCT reason FROM deduplicated WHERE NOT keep")}
    assert reasons & {"exact_duplicate", "near_duplicate"}

    caught = {noise: (injected, removed) for noise, injected, removed in _query(config, NOISE_SQL)}
    for noise in ("exact_duplicate", "too_short", "boilerplate"):
        injected, removed = caught[noise]
        assert injected > 0 and removed == injected, noise

    evaluation = _query(config, "SELECT source, loss, bits_per_byte FROM proxy_eval ORDER BY source")
    assert [row[0] for row in evaluation] == sorted(config.source_names)
    assert all(math.isfinite(loss) and bpb > 0 for _, loss, bpb in evaluation)

    mixture = json.loads((Path(config.lake_root) / "tokenized_mixture" / "mixture.json").read_text())
    assert mixture["num_sequences"] > 0

    # Scoring again with the same heads and thresholds redoes no shard.
    definitions = build_definitions(config_path)
    again = dg.materialize(
        list(definitions.assets),
        selection=["scored_documents"],
        partition_key="prose",
        instance=instance,
        resources=definitions.resources,
    )
    metadata = again.asset_materializations_for_node("scored_documents")[0].metadata
    assert metadata["shards_run"].value == 0 and metadata["rows_in"].value > 0

    summary = format_summary(config)
    assert "bits per byte" in summary and "duplicates removed" in summary

    # On an unchanged lake a second run launches nothing: no stage, no heads training, no proxy.
    heads = instance.get_latest_materialization_event(dg.AssetKey("quality_heads"))
    messages = []
    again = materialize_all(str(config_path), instance=instance, log=messages.append)
    stages_run = [stage for stage in stages(definitions) if config.comparisons or not stage.comparisons]
    ran = [key for stage in stages_run for key in stage.assets]
    assert again.launched == [] and messages[-1].startswith(f"up to date: {len(ran)} assets")
    assert instance.get_latest_materialization_event(dg.AssetKey("quality_heads")).run_id == heads.run_id

    capsys.readouterr()
    cli.main(["--config", str(config_path), "query", "SELECT count(*) AS n FROM quarantine"])
    assert str(manifest["malformed_lines"]) in capsys.readouterr().out


def _query(config, sql: str) -> list[tuple]:
    from moe_dag.storage.catalog import Catalog
    from moe_dag.storage.lake import Lake

    return Catalog(config.catalog_path, Lake(config.lake_root)).query(sql)
