"""The training assets in Dagster: the tokenizer never sees held-out text; moe_proxy trains through Pipes
and reports its figures and plots; proxy_eval publishes intervals; moe_gain compares with a dense twin."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from moe_dag.assets.comparisons import moe_gain
from moe_dag.assets.mixture import tokenized_mixture, tokenizer
from moe_dag.assets.training import moe_proxy, proxy_eval
from moe_dag.config import load_config
from moe_dag.mixture import split_heldout
from moe_dag.mixture.tokenizer import load_tokenizer
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake
from tests.pipeline_configs import Replace, edited_config

SECRET = "zyzzogeton"  # a word only the held-out documents contain


@pytest.fixture
def pipeline_config(make_config) -> Path:
    """configs/demo.yaml's sources, a scored_documents table per source in a fresh lake, tiny training."""
    overrides = {"train.num_threads": 1, "train.checkpoint_every": 4}
    path = make_config(
        {
            "tokenizer": {"vocab_size": 300},
            "mixture": Replace(seq_len=32, heldout_fraction=0.1, heldout_min_documents=8),
            "training": Replace(preset="tiny", steps=8, overrides=overrides),
            "evaluation": {"neutral_share": 0},  # no raw documents here: tests/test_decisions.py has them
        }
    )
    config = load_config(path)
    rng = np.random.default_rng(0)
    words = ["data", "model", "expert", "token", "the", "of", "and", "route", "grüße", "def"]
    lake = Lake(config.lake_root)
    for source in config.source_names:
        ids = [f"{source}-{i}" for i in range(60)]
        texts = [" ".join(rng.choice(words, size=rng.integers(5, 40))) for _ in ids]
        table = pa.table({"id": ids, "text": texts})
        held = set(split_heldout(table, 0.1, 8)[1]["id"].to_pylist())
        texts = [
            f"{text} {SECRET}" * 20 if doc_id in held else text
            for doc_id, text in zip(ids, texts, strict=True)
        ]
        scored = pa.table(
            {"id": ids, "text": texts, "source": [source] * 60, "keep": [True] * 60, "reason": [None] * 60}
        )
        lake.write_file(scored, lake.shard_path("scored_documents", source, "s0"))
        lake.write_record("scored_documents", source, "s0", {"digest": f"{source}-s0"})
    return path


def materialize(
    assets: list, config_path: Path, instance: dg.DagsterInstance | None = None
) -> dg.ExecuteInProcessResult:
    resources = build_definitions(config_path).resources
    return dg.materialize(assets, resources=resources, instance=instance)


def test_the_tokenizer_never_sees_a_heldout_document(pipeline_config: Path, local_ray) -> None:
    """The held-out documents repeat one word hundreds of times: a tokenizer that saw them would learn
    it as a token. The tokenizer asset must not, while the mixture still holds those documents out."""
    result = materialize([tokenizer, tokenized_mixture], pipeline_config)
    lake = Lake(load_config(pipeline_config).lake_root)
    trained = load_tokenizer(lake.artifact_dir("tokenizer") / "tokenizer.json")
    assert not any(SECRET[:4] in token for token in trained.get_vocab())
    assert len(trained.encode(SECRET).ids) >= 5
    metadata = result.asset_materializations_for_node("tokenizer")[0].metadata
    assert metadata["training_documents"].value == 3 * (60 - 8)
    heldout = pa.parquet.read_table(lake.artifact_dir("tokenized_mixture") / "heldout.parquet")
    assert heldout.num_rows == 3 * 8


@pytest.mark.slow
def test_moe_proxy_reports_through_pipes_and_proxy_eval_publishes_intervals(
    pipeline_config: Path, local_ray
) -> None:
    config = load_config(pipeline_config)
    materialize([tokenizer, tokenized_mixture], pipeline_config)
    instance = dg.DagsterInstance.ephemeral()
    result = materialize([moe_proxy, proxy_eval, moe_gain], pipeline_config, instance)
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("step 5/8  loss" in message for message in messages)  # progress, streamed through Pipes

    trained = result.asset_materializations_for_node("moe_proxy")[0].metadata
    assert trained["steps"].value == 8 and trained["device"].value == "cpu"
    assert trained["heldout_documents"].value == 3 * 8
    low, high = trained["heldout_bits_per_byte_ci95"].value
    assert low < trained["heldout_bits_per_byte"].value < high
    for plot in ("loss_curve", "expert_load", "source_shares"):
        assert trained[plot].value.startswith(f"![{plot.replace('_', ' ')}](data:image/png;base64,")

    rows = Catalog(config.catalog_path, Lake(config.lake_root)).query(
        "SELECT source, documents, bits_per_byte_ci_low, bits_per_byte, bits_per_byte_ci_high FROM proxy_eval"
    )
    assert sorted(row[0] for row in rows) == sorted(config.source_names)
    assert all(documents == 8 and low <= bpb <= high for _, documents, low, bpb, high in rows)

    gain = result.asset_materializations_for_node("moe_gain")[0].metadata
    low, high = gain["gain_ci95"].value
    assert low <= gain["gain_bits_per_byte"].value <= high and gain["documents"].value == 3 * 8
    assert "| source | documents |" in gain["table"].value
    dense_run = Path(gain["baseline_run"].value)
    dense = json.loads((dense_run / "summary.json").read_text())
    assert dense["params"]["groups"].get("routed_experts") is None
    assert dense["params"]["active"] == pytest.approx(trained["active_params"].value, rel=0.02)


def test_the_comparisons_can_be_left_out_of_a_whole_run(
    pipeline_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moe_dag.orchestration import pipeline

    edited_config(pipeline_config, {"comparisons": False})
    comparisons = [
        stage for stage in pipeline.stages(build_definitions(pipeline_config)) if stage.comparisons
    ]
    monkeypatch.setattr(pipeline, "stages", lambda definitions: comparisons)
    said: list[str] = []
    pipeline.materialize_all(str(pipeline_config), log=said.append)
    assert said == [
        f"{', '.join(comparisons[0].assets)}: skipped "
        f"(comparisons: false in {pipeline_config}; --comparisons runs them)"
    ]
    assert sorted(comparisons[0].assets) == ["curation_gain", "moe_gain", "unfiltered_mixture"]
