"""A lake on object storage: `lake_root` as `s3://bucket/lake` against a real S3 server (moto's, started
by tests/conftest.py on a free port), through s3fs. Artefacts are written to the local mirror,
published to the bucket, and read back through a second machine's empty cache."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pytest
import torch

s3fs = pytest.importorskip("s3fs")

from moe_dag.mixture.token_shards import TokenShard, write_token_shard  # noqa: E402
from moe_dag.mixture.tokenizer import (  # noqa: E402
    TokenizerConfig,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)
from moe_dag.quality.heads import (  # noqa: E402
    BackboneConfig,
    JudgeHead,
    JudgeHeadConfig,
    ProbeHead,
    QualityHeads,
    Thresholds,
    load_heads,
    save_heads,
)
from moe_dag.storage.catalog import Catalog  # noqa: E402
from moe_dag.storage.lake import ARTIFACT_MANIFEST, Lake, LakeArtifact  # noqa: E402

BUCKET = "bucket"
TEXTS = [f"document {i} about rivers, bridges and the number {i * 7}" for i in range(40)]


@pytest.fixture
def s3_lake_url(s3_server, monkeypatch, tmp_path):
    """`s3://bucket/lake` on the test's server, configured as an operator would: AWS environment
    variables, which botocore (under s3fs) reads, and so do Ray workers and torchrun ranks."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("MOE_DAG_LAKE_CACHE", str(tmp_path / "cache"))
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    prefix = f"{BUCKET}/lake-{tmp_path.name}"
    yield f"s3://{prefix}"
    if fs.exists(prefix):
        fs.rm(prefix, recursive=True)
    s3fs.S3FileSystem.clear_instance_cache()


def other_machine(url: str, tmp_path, name: str) -> Lake:
    """The same lake seen from a machine whose cache is empty."""
    return Lake(url, cache_dir=tmp_path / name)


def small_heads() -> QualityHeads:
    torch.manual_seed(0)
    outputs = {"general": 3}
    return QualityHeads(ProbeHead(8, outputs), JudgeHead(8, JudgeHeadConfig(d_model=8, n_heads=2), outputs))


def test_local_artifact_dir_is_the_lake_folder_and_publishing_copies_nothing(tmp_path):
    lake = Lake(tmp_path / "lake")
    folder = lake.artifact_dir("quality_heads")
    assert folder == tmp_path / "lake" / "quality_heads"
    (folder / "weights.bin").write_bytes(b"x")
    assert lake.publish_artifact("quality_heads") is None
    assert sorted(p.name for p in folder.iterdir()) == ["weights.bin"]


def test_memory_lake_artifacts_round_trip_through_the_cache(tmp_path):
    url = f"memory://lake-{tmp_path.name}"
    writer = Lake(url, cache_dir=tmp_path / "writer")
    with writer.writing_artifact("quality_heads") as folder:
        (folder / "meta.json").write_text("{}")
    reader = other_machine(url, tmp_path, "reader")
    assert (reader.artifact_dir("quality_heads") / "meta.json").read_text() == "{}"


def test_heads_published_to_s3_load_on_another_machine_and_follow_new_versions(s3_lake_url, tmp_path):
    writer = Lake(s3_lake_url)
    thresholds = {"web": Thresholds(tau_drop=0.2, tau_keep=0.6)}
    with writer.writing_artifact("quality_heads") as folder:
        version = save_heads(folder, small_heads(), thresholds, BackboneConfig(), {"judge_f1": 0.5})
    assert writer.fs.exists(f"{s3_lake_url}/quality_heads/{ARTIFACT_MANIFEST}")

    reader = other_machine(s3_lake_url, tmp_path, "reader")
    stored = load_heads(reader.artifact_dir("quality_heads"))
    assert stored.version == version and stored.thresholds == thresholds
    # A Ray actor on another node names the folder by lake URL and gets its own local copy.
    assert (
        load_heads(LakeArtifact(s3_lake_url, "quality_heads", cache_dir=str(tmp_path / "node"))).version
        == version
    )

    new_thresholds = {"web": Thresholds(tau_drop=0.1, tau_keep=0.9)}
    with writer.writing_artifact("quality_heads") as folder:
        save_heads(folder, small_heads(), new_thresholds, BackboneConfig())
    assert load_heads(reader.artifact_dir("quality_heads")).thresholds == new_thresholds


def test_unpublished_files_are_invisible_to_readers_and_survive_a_refresh(s3_lake_url, tmp_path):
    writer = Lake(s3_lake_url)
    with writer.writing_artifact("moe_proxy") as folder:
        (folder / "run-a").mkdir()
        (folder / "run-a" / "checkpoint.pt").write_bytes(b"a" * 100)
    in_progress = writer.artifact_dir("moe_proxy") / "run-b"
    in_progress.mkdir()
    (in_progress / "checkpoint.pt").write_bytes(b"b")

    reader = other_machine(s3_lake_url, tmp_path, "reader")
    assert sorted(
        p.name for p in reader.artifact_dir("moe_proxy").iterdir() if not p.name.startswith(".")
    ) == ["run-a"]
    assert (writer.artifact_dir("moe_proxy") / "run-b" / "checkpoint.pt").read_bytes() == b"b"
    writer.publish_artifact("moe_proxy")
    assert (reader.artifact_dir("moe_proxy") / "run-b" / "checkpoint.pt").read_bytes() == b"b"


def test_tokenizer_and_token_shard_on_s3_are_memory_mapped_from_the_local_copy(s3_lake_url, tmp_path):
    writer = Lake(s3_lake_url)
    tokenizer = train_tokenizer(TEXTS, TokenizerConfig(vocab_size=300))
    table = pa.table({"id": [f"d{i}" for i in range(len(TEXTS))], "text": TEXTS})
    with writer.writing_artifact("tokenizer") as folder:
        save_tokenizer(tokenizer, folder)
    with writer.writing_artifact("tokenized_mixture") as folder:
        written = write_token_shard(table, tokenizer, 0, folder, "web")

    reader = other_machine(s3_lake_url, tmp_path, "reader")
    loaded = load_tokenizer(reader.artifact_dir("tokenizer"))
    assert loaded.encode(TEXTS[3]).ids == tokenizer.encode(TEXTS[3]).ids
    shard = TokenShard.open(reader.artifact_dir("tokenized_mixture"), "web")
    assert isinstance(shard.tokens, np.memmap)
    assert len(shard) == len(written) == len(TEXTS)
    assert all(np.array_equal(shard.document(i), written.document(i)) for i in range(len(TEXTS)))


def test_a_token_shard_written_by_a_stage_on_s3_is_memory_mapped_from_the_local_slice(s3_lake_url, tmp_path):
    """The engine's files written by path (token shards) go to the lake through a local staging file;
    readers memory-map the slice's local copy, refreshed when a shard is rewritten."""
    from moe_dag.engine.shards import ShardInput
    from moe_dag.engine.stage import ShardWork, StageSpec, process_shard
    from moe_dag.mixture.token_shards import TokenShardWriter

    tokenizer = train_tokenizer(TEXTS, TokenizerConfig(vocab_size=300))

    class Tokenize(ShardWork):
        def __init__(self, texts: list[str]) -> None:
            self.texts = texts

        def process(self, shard, out):
            writer = TokenShardWriter(
                tokenizer, 0, out.local_path("tokens", ".bin"), out.local_path("tokens", ".index.parquet")
            )
            with writer:
                writer.write(pa.table({"id": [str(i) for i in range(len(self.texts))], "text": self.texts}))
            return {"documents": len(self.texts)}

    lake = Lake(s3_lake_url)
    shard = ShardInput(key="s0", path="corpus/s0.jsonl", fingerprint="f0")
    for texts in (TEXTS[:5], TEXTS[5:8]):  # the second run rewrites the shard
        spec = StageSpec(outputs=("tokens",), make_work=functools.partial(Tokenize, texts))
        result = process_shard(spec, spec.make_work(), lake, "web", shard)
        assert "error" not in result, result
        assert lake.fs.exists(lake.shard_path("tokens", "web", "s0", ".bin"))
        local = other_machine(s3_lake_url, tmp_path, "reader").local_slice("tokens", "web")
        read_back = TokenShard.open(local, "s0")
        assert isinstance(read_back.tokens, np.memmap) and len(read_back) == len(texts)
        expected = tokenizer.encode(texts[1]).ids + [0]
        assert read_back.document(1).tolist() == expected
    assert not list((Lake(s3_lake_url).cache_dir / ".staging").iterdir())  # no staging file left


def test_catalog_views_read_tables_of_an_s3_lake(s3_lake_url, tmp_path):
    lake = Lake(s3_lake_url)
    lake.write_table(pa.table({"source": ["a", "a"], "keep": [True, False]}), "stage", "a")
    lake.write_table(pa.table({"source": ["b"], "keep": [True]}), "stage", "b")
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    assert catalog.refresh({"stage": True, "missing": False}) == ["stage"]
    rows = catalog.query_arrow("SELECT source, count(*) AS n FROM stage GROUP BY source ORDER BY source")
    assert rows.to_pylist() == [{"source": "a", "n": 2}, {"source": "b", "n": 1}]


@pytest.mark.slow
def test_curation_and_dedup_on_an_s3_lake_equal_a_local_lake(s3_lake_url, tmp_path):
    """The per-source curation stages, dedup clustering and the dedup apply of the tiny two-source
    corpus, materialised by Dagster (Ray workers included) on the S3 lake and on a local one."""
    import dagster as dg
    import ray

    from moe_dag.config import load_config
    from moe_dag.orchestration.definitions import build_definitions
    from tests.pipeline_configs import edited_config
    from tests.test_dedup_backfill import SOURCES, full_run, pipeline_config, sentence_text, write_shard

    corpus = tmp_path / "corpus"
    write_shard(corpus / "a", "shard-0", {f"a{i}": sentence_text(i) for i in range(3)})
    write_shard(corpus / "b", "shard-0", {f"b{i}": sentence_text(10 + i) for i in range(3)})
    kept = {}
    # Ray workers take the environment of the Ray they belong to: one started before this test set the
    # S3 endpoint and keys would have none, so the resource starts a Ray of its own here.
    ray.shutdown()
    for name in ("local", "s3"):
        config_path = pipeline_config(tmp_path, corpus, name)
        if name == "s3":
            edited_config(config_path, {"lake_root": s3_lake_url})
        full_run(build_definitions(config_path), dg.DagsterInstance.ephemeral())
        lake = Lake(load_config(config_path).lake_root)
        kept[name] = {
            source: lake.read_table("deduplicated", source, columns=["id", "keep"]).to_pylist()
            for source in SOURCES
        }
    ray.shutdown()  # later tests start theirs, with their own environment
    assert kept["s3"] == kept["local"]
    assert sum(row["keep"] for rows in kept["s3"].values() for row in rows) == 6
