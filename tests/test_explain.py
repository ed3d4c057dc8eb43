"""`moe-dag explain` on a materialised tiny demo: a kept, a dropped, a quarantined and an unknown id, and
the training rows it names checked against the token shards and the trainer's own batches."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from moe_dag.cli import main as cli
from moe_dag.config import load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.mixture.curated import TOKENS_STAGE
from moe_dag.mixture.token_shards import TokenShard
from moe_dag.orchestration.pipeline import materialize_all
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake
from moe_dag.training.data import TrainBatches
from tests.test_end_to_end import tiny_config


@pytest.fixture(scope="module")
def demo(tmp_path_factory, local_ray):
    folder = tmp_path_factory.mktemp("explain")
    config_path = tiny_config(folder)
    config = load_config(config_path)
    manifest = build_demo_corpus(folder / "corpus", config.demo_corpus)
    materialize_all(str(config_path), instance=dg.DagsterInstance.ephemeral(), log=lambda _: None)
    return config_path, config, manifest, Catalog(config.catalog_path, Lake(config.lake_root))


def explain(config_path: Path, document_id: str, capsys) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    code = cli.main(["--config", str(config_path), "explain", document_id, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_a_kept_document_names_its_line_decisions_sequences_and_training_steps(demo, capsys):
    config_path, config, _, catalog = demo
    ((document_id, source),) = catalog.query(
        "SELECT s.id, s.source FROM scored_documents s JOIN tokenized_mixture_sequences m "
        "ON m.source = s.source AND m.document_id = s.id WHERE s.keep ORDER BY s.id LIMIT 1"
    )
    code, trace, _ = explain(config_path, document_id, capsys)
    assert code == 0
    (document,) = trace["documents"]
    ((shard, line),) = catalog.query(f"SELECT shard, line FROM raw_documents WHERE id = '{document_id}'")
    assert (document["source"], document["shard"], document["line"]) == (source, shard, line)
    assert [(s["stage"], s["keep"]) for s in document["stages"]] == [
        ("prefiltered", True),
        ("deduplicated", True),
        ("toxicity_filtered", True),
        ("scored_documents", True),
    ]
    assert document["dedup"]["survivor"] == {"source": source, "id": document_id}
    assert document["head_scores"]["probe_score"] is not None
    (mixture,) = document["mixtures"]
    pieces = mixture["sequences"]

    # The pieces are the document's tokens, whole and in order, where train.npy holds them.
    lake = Lake(config.lake_root)
    folder = lake.local_slice(TOKENS_STAGE, source)
    shards = [
        TokenShard.open(folder, path.name.removesuffix(".bin")) for path in sorted(folder.glob("*.bin"))
    ]
    ((shard, index),) = [
        (s, i) for s in shards for i, name in enumerate(s.ids.to_pylist()) if name == document_id
    ]
    tokens = shard.document(index)
    train = np.load(Path(config.lake_root) / "tokenized_mixture" / "train.npy", mmap_mode="r")
    assert pieces[0]["token_start"] == 0
    assert [p["token_start"] for p in pieces[1:]] == [p["token_end"] for p in pieces[:-1]]
    for piece in pieces:
        span = piece["token_end"] - piece["token_start"]
        stored = train[piece["sequence"], piece["position"] : piece["position"] + span]
        assert np.array_equal(stored, tokens[piece["token_start"] : piece["token_end"]])

    # The steps are those at which the trainer's own batches held one of those rows.
    (run,) = mixture["runs"]
    summary = json.loads((Path(run["run"]) / "summary.json").read_text())
    train_config = summary["config"]["train"]
    batches = TrainBatches(Path(summary["data_dir"]), batch_size=train_config["batch_size"])
    rows, steps = {p["sequence"] for p in pieces}, set()
    for micro in range(summary["steps"] * train_config["grad_accum_steps"]):
        inputs, _ = batches.next_batch()
        read = {
            int(r) for r in np.flatnonzero((train[:, :-1][:, None, :] == inputs.numpy()[None]).all(-1).any(1))
        }
        if read & rows:
            steps.add(micro // train_config["grad_accum_steps"] + 1)
    expanded = {step for first, last in run["step_ranges"] for step in range(first, last + 1)}
    assert expanded == steps and steps


def test_a_dropped_document_names_the_reason_and_the_config_key_behind_it(demo, capsys):
    config_path, config, _, catalog = demo
    ((document_id, source, reason),) = catalog.query(
        "SELECT id, source, reason FROM prefiltered WHERE NOT keep AND reason = 'code_too_few_lines' LIMIT 1"
    )
    code, trace, _ = explain(config_path, document_id, capsys)
    assert code == 0
    stages = trace["documents"][0]["stages"]
    assert stages[0] == {
        "stage": "prefiltered",
        "keep": False,
        "reason": reason,
        "setting": str(config.reason_settings("prefiltered", source)[reason]),
    }
    assert all(s["reason"] == "not reached" for s in stages[1:])
    assert trace["documents"][0]["mixtures"][0]["sequences"] == []
    capsys.readouterr()
    assert cli.main(["--config", str(config_path), "explain", document_id]) == 0
    assert f"dropped: {reason} (sources[{source}].prefilter.code.min_lines = " in capsys.readouterr().out


def test_a_quarantined_line_is_found_by_the_id_it_names(demo, capsys):
    config_path, _, manifest, _ = demo
    missing_text = next(m for m in manifest["malformed"] if m["kind"] == "missing_text")
    code, trace, _ = explain(config_path, "prose/doc-no-text", capsys)
    assert code == 0 and trace["documents"] == []
    (quarantined,) = trace["quarantined"]
    assert quarantined["line"] == missing_text["line"] and quarantined["shard"].endswith(
        missing_text["shard"]
    )
    assert "text" in quarantined["error"]


def test_an_unknown_id_is_not_found_and_exits_1(demo, capsys):
    config_path, *_ = demo
    code, _, err = explain(config_path, "no/such-document", capsys)
    assert code == 1
    assert "document 'no/such-document' not found" in err
