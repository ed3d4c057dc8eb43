"""The proxies that decide, materialised on a tiny corpus: the neutral set in proxy_eval and the catalog,
curation_gain and moe_gain on the curated and neutral sets ending in one sentence, and a 4-candidate
mixture search from candidates to report. Tiny trainings (8 steps of the tiny preset) keep each test
within a minute or two on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from moe_dag.assets.comparisons import curation_gain, moe_gain, unfiltered_mixture
from moe_dag.assets.evaluation import evaluation_sets, neutral_documents
from moe_dag.assets.mixture import tokenized_mixture, tokenizer
from moe_dag.assets.mixture_search import (
    CANDIDATES,
    candidate_proxy,
    mixture_candidates,
    mixture_proposal,
    mixture_search_report,
    mixture_validation,
)
from moe_dag.assets.training import moe_proxy, proxy_eval
from moe_dag.config import load_config
from moe_dag.mixture.neutral import is_neutral
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake
from tests.pipeline_configs import Replace, demo_config

pytestmark = pytest.mark.slow
DOCUMENTS = 60


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, local_ray) -> tuple[Path, dg.DagsterInstance]:
    """A lake with raw, clustered and scored documents per source (all kept), a tiny proxy trained on
    them and scored on the neutral set; the config's path and the instance that recorded it."""
    root = tmp_path_factory.mktemp("decisions")
    path = demo_config(
        root,
        {
            "tokenizer": {"vocab_size": 300},
            "mixture": Replace(seq_len=32, heldout_fraction=0.1, heldout_min_documents=8),
            "training": Replace(
                preset="tiny", steps=8, overrides={"train.num_threads": 1, "train.checkpoint_every": 4}
            ),
            "evaluation": {"neutral_share": 0.1},
            "mixture_search": {
                "candidates": 4,
                "steps": 8,
                "overrides": {"train.batch_size": 4},
                "proposals_sampled": 200,
                "top_k": 10,
                "min_neutral_documents": 3,  # about 6 of each source's 60 documents are neutral here
            },
        },
    )
    config = load_config(path)
    lake, rng = Lake(config.lake_root), np.random.default_rng(0)
    words = ["data", "model", "expert", "token", "the", "of", "and", "route", "grüße", "def"]
    clusters = {"id": [], "cluster_id": []}
    for source in config.source_names:
        ids = [f"{source}/{i}" for i in range(DOCUMENTS)]
        texts = [" ".join(rng.choice(words, size=rng.integers(5, 40))) for _ in ids]
        documents = {"id": ids, "text": texts, "source": [source] * DOCUMENTS}
        lake.write_file(pa.table(documents), lake.shard_path("raw_documents", source, "s0"))
        # Finished, as ingest would leave it: the stages after it read only recorded shards.
        lake.write_record("raw_documents", source, "s0", {"digest": f"{source}-raw-s0"})
        kept = {**documents, "keep": [True] * DOCUMENTS, "reason": [None] * DOCUMENTS}
        lake.write_file(pa.table(kept), lake.shard_path("scored_documents", source, "s0"))
        lake.write_record("scored_documents", source, "s0", {"digest": f"{source}-s0"})
        clusters["id"] += ids
        clusters["cluster_id"] += ids
    lake.write_table(pa.table(clusters), "dedup_clusters")
    instance = dg.DagsterInstance.ephemeral()
    assets = [neutral_documents, tokenizer, tokenized_mixture, evaluation_sets, moe_proxy, proxy_eval]
    materialize(assets, path, instance)
    return path, instance


def neutral_count(source: str) -> int:
    """The source's raw documents in the neutral set at `neutral_share` 0.1 (about 6 of 60)."""
    return sum(is_neutral(pa.array([f"{source}/{i}" for i in range(DOCUMENTS)]), 0.1).to_pylist())


def materialize(
    assets: list, config_path: Path, instance: dg.DagsterInstance, partition: str | None = None
) -> dg.ExecuteInProcessResult:
    resources = build_definitions(config_path).resources
    return dg.materialize(assets, resources=resources, instance=instance, partition_key=partition)


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node(asset)[-1].metadata.items()}


def test_the_neutral_set_is_scored_by_proxy_eval_and_listed_in_the_catalog(trained) -> None:
    path, _ = trained
    config = load_config(path)
    rows = Catalog(config.catalog_path, Lake(config.lake_root)).query(
        "SELECT eval_set, source, documents, bits_per_byte_ci_low <= bits_per_byte FROM proxy_eval_sets "
        "ORDER BY source"
    )
    neutral = {s: neutral_count(s) for s in config.source_names}
    assert {(r[0], r[1], r[2]) for r in rows} == {("neutral", s, n) for s, n in neutral.items()} | {
        ("neutral", "all", sum(neutral.values()))
    }
    assert all(r[3] for r in rows)
    listed = Catalog(config.catalog_path, Lake(config.lake_root)).query(
        "SELECT count(*) FROM evaluation_documents WHERE eval_set = 'neutral'"
    )
    assert listed == [(sum(neutral.values()),)]


def test_curation_and_moe_gains_end_in_one_sentence_on_both_sets(trained) -> None:
    path, instance = trained
    result = materialize([unfiltered_mixture, curation_gain, moe_gain], path, instance)
    for asset, what in (("curation_gain", "curation gain"), ("moe_gain", "MoE gain")):
        metadata = _metadata(result, asset)
        assert set(metadata["verdicts"]) == {"curated", "neutral"}
        assert metadata["verdict"] == metadata["verdicts"]["neutral"]
        for name, sentence in metadata["verdicts"].items():
            gain = metadata["gains"][name]
            assert sentence.startswith(f"{what} on the {name} set: {gain['gain']:+.4f} bits/byte")
            low, high = gain["gain_ci95"]
            assert low <= gain["gain"] <= high
            assert gain["resolved"] == (low > 0 or high < 0)
            assert gain["resolved"] or "not resolved at this budget" in sentence
            assert sentence.count(".") >= 1 and "at 8 steps" in sentence


def test_a_four_candidate_search_proposes_validates_and_reports(trained) -> None:
    path, instance = trained
    result = materialize([mixture_candidates], path, instance)
    assert _metadata(result, "mixture_candidates")["candidates"] == 4
    keys = instance.get_dynamic_partitions(CANDIDATES.name)
    assert sorted(keys) == ["c000", "c001", "c002", "c003", "configured"]
    for key in keys:
        materialize([candidate_proxy], path, instance, partition=key)
    result = materialize([mixture_proposal, mixture_validation, mixture_search_report], path, instance)
    proposal = _metadata(result, "mixture_proposal")
    assert sum(proposal["proposal"].values()) == pytest.approx(1)
    assert "mixture_weight" in proposal["config_snippet"]
    # The model families left out of the choice, each with why its fit failed, in the file as well.
    config = load_config(path)
    folder = Lake(config.lake_root).artifact_dir("mixture_search")
    written = json.loads((folder / "proposal.json").read_text())
    assert written["failed"] == proposal["failed"]
    assert all(isinstance(why, str) and why for why in proposal["failed"].values())
    validation = _metadata(result, "mixture_validation")
    low, high = validation["gain_vs_configured_ci"]
    assert low <= validation["gain_vs_configured"] <= high
    roles = Catalog(config.catalog_path, Lake(config.lake_root)).query(
        "SELECT role, count(*) FROM mixture_search GROUP BY role ORDER BY role"
    )
    assert roles == [("candidate", 4), ("configured", 2), ("proposal", 2)]  # final_seeds 2
