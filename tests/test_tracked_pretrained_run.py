"""One tiny demo graph run to `proxy_eval` with a pretrained tokenizer (`tokenizer: {from: PATH}`, the
all-MiniLM-L6-v2 package's tokenizer.json) and wandb offline: the tokenizer asset uses that file, its
digest is in the code version, and the trainer's wandb run holds the Dagster run id, the code and input
data versions and the config digest, found from the asset's metadata and from the run folder."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from wandb.proto import wandb_internal_pb2

from moe_dag.config import config_version, load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.mixture.tokenizer import load_tokenizer
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.pipeline import materialize_all
from moe_dag.quality.heads.backbone import default_model_path
from moe_dag.settings.training import tokenizer_settings
from moe_dag.training.tracking import GRAPH_CONTEXT_FILE, TRACKING_FILE
from tests.pipeline_configs import edited_config
from tests.test_end_to_end import tiny_config

PRETRAINED = default_model_path() / "tokenizer.json"  # WordPiece, 30,522 ids, [SEP] ends a document


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, local_ray):
    folder = tmp_path_factory.mktemp("pretrained")
    changes = {
        "tokenizer": {"from": str(PRETRAINED)},
        "mixture": {"eos_token": "[SEP]"},
        "training": {"overrides": {"train.wandb_mode": "offline"}},
    }
    config_path = edited_config(tiny_config(folder), changes)
    config = load_config(config_path)
    build_demo_corpus(folder / "corpus", config.demo_corpus)
    instance = dg.DagsterInstance.ephemeral()
    materialize_all(str(config_path), instance=instance, log=lambda _: None)
    return config_path, config, instance


def test_the_graph_runs_to_proxy_eval_on_the_pretrained_tokenizer(tracked_run):
    config_path, config, instance = tracked_run
    lake = Path(config.lake_root)
    used = load_tokenizer(lake / "tokenizer")
    assert used.get_vocab(with_added_tokens=True) == load_tokenizer(PRETRAINED).get_vocab(
        with_added_tokens=True
    )
    assert used.truncation is None and used.padding is None  # whole documents, not MiniLM's 128 tokens
    mixture = json.loads((lake / "tokenized_mixture" / "mixture.json").read_text())
    assert mixture["num_sequences"] > 0
    assert instance.get_latest_materialization_event(dg.AssetKey("proxy_eval")) is not None

    # The file's digest is in the tokenizer's code version: another file at the same path changes it.
    spec = (
        build_definitions(config_path).resolve_assets_def("tokenizer").specs_by_key[dg.AssetKey("tokenizer")]
    )
    digest = tokenizer_settings(config).pretrained_digest
    assert digest and spec.code_version
    metadata = instance.get_latest_materialization_event(
        dg.AssetKey("tokenizer")
    ).asset_materialization.metadata
    assert metadata["pretrained_digest"].value == digest


def test_a_changed_pretrained_file_changes_the_tokenizers_code_version(tracked_run, tmp_path):
    config_path, _, _ = tracked_run
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(PRETRAINED.read_bytes())

    def code_version(path: Path) -> str:
        edited = edited_config(config_path, {"tokenizer": {"from": str(path)}}, tmp_path / "pipeline.yaml")
        specs = build_definitions(edited).resolve_assets_def("tokenizer").specs_by_key
        return specs[dg.AssetKey("tokenizer")].code_version

    before = code_version(copy)
    copy.write_bytes(PRETRAINED.read_bytes().replace(b'"[SEP]"', b'"[END]"'))
    assert code_version(copy) != before


def test_the_wandb_run_holds_the_dagster_run_and_the_data_versions(tracked_run):
    config_path, config, instance = tracked_run
    event = instance.get_latest_materialization_event(dg.AssetKey("moe_proxy"))
    metadata = event.asset_materialization.metadata
    run_dir = Path(metadata["run_dir"].value)
    mixture = instance.get_latest_materialization_event(dg.AssetKey("tokenized_mixture"))
    spec = (
        build_definitions(config_path).resolve_assets_def("moe_proxy").specs_by_key[dg.AssetKey("moe_proxy")]
    )
    expected = {
        "dagster_run_id": event.run_id,
        "asset": "moe_proxy",
        "partition": None,
        "code_version": spec.code_version,
        "input_data_versions": {
            "tokenized_mixture": mixture.asset_materialization.tags["dagster/data_version"]
        },
        "config_digest": config_version(config_path),
    }
    assert json.loads((run_dir / GRAPH_CONTEXT_FILE).read_text()) == expected

    # From the Dagster UI (the asset's metadata) and from the run folder: the same wandb run.
    record = metadata["tracking"].value
    assert record == json.loads((run_dir / TRACKING_FILE).read_text())
    assert record["backend"] == "wandb" and record["mode"] == "offline" and record["graph"] == expected
    assert record["run_id"] == (run_dir / "wandb_run_id").read_text()

    # What wandb itself recorded, read from its offline run file.
    (run_file,) = Path(record["files"]).glob("run-*.wandb")
    records = list(wandb_records(run_file))
    logged = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    assert logged["graph"] == expected and logged["run_dir"] == str(run_dir)
    assert logged["train"]["steps"] == config.training.steps
    tags = {tag for r in records if r.WhichOneof("record_type") == "run" for tag in r.run.tags}
    assert {
        f"dagster_run_id:{event.run_id}",
        "asset:moe_proxy",
        f"config_digest:{config_version(config_path)}",
    } <= tags
    losses = [
        json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "history"
        for item in r.history.item
        if item.nested_key == ["loss"] or item.key == "loss"
    ]
    assert len(losses) == config.training.steps


def wandb_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of a wandb run file (`run-<id>.wandb`): a 7-byte header (":W&B", magic, version),
    then LevelDB-log blocks of 32 KiB whose chunks (checksum, length, type: full, first, middle, last)
    carry serialised `Record`s."""
    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    position, pending = 7, b""
    while position + 7 <= len(data):
        left_in_block = block - position % block
        _, length, kind = (
            struct.unpack("<IHB", data[position : position + 7]) if left_in_block >= 7 else (0, 0, 0)
        )
        if left_in_block < 7 or (length, kind) == (0, 0):  # the block's zero padding
            position += left_in_block
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record
