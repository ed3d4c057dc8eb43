"""Issues 33 and 35 item 11: raw shards on a real S3 server (moto's, through s3fs), read end to end by
`raw_documents` and `prefiltered`; credentials the store refuses and an endpoint that cannot be
reached each fail the source once, naming what to fix, with nothing written to the lake; a store that
stops replying (SIGSTOP) fails a listing or a read within the configured timeouts, naming the
endpoint and the setting to raise."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
import zstandard

s3fs = pytest.importorskip("s3fs")

from moe_dag.config import load_config  # noqa: E402
from moe_dag.orchestration.definitions import build_definitions  # noqa: E402
from moe_dag.storage.lake import Lake  # noqa: E402
from moe_dag.storage.object_store import S3_CONFIG_ENV, ObjectStoreError  # noqa: E402
from moe_dag.storage.readers import list_shards, read_shard, read_shards  # noqa: E402
from tests.local_processes import free_port  # noqa: E402
from tests.pipeline_configs import edited_config  # noqa: E402
from tests.test_dedup_backfill import sentence_text  # noqa: E402

BUCKET = "raw"
SOURCE = "web"
# Shard paths below the source's location: plain and zstd JSON lines, one in a subfolder.
SHARDS = ("part-0.jsonl", "more/part-1.jsonl.zst")
# Small enough that a stalled store fails in seconds (s3fs tries each call 5 times).
TIMEOUTS = {"connect_timeout_s": 0.3, "read_timeout_s": 0.3, "attempts": 1}


def shard_bytes(name: str) -> bytes:
    """Documents that pass the prefilter, one too short for it, and a line that is not JSON."""
    first = 0 if name == SHARDS[0] else 10
    lines = [json.dumps({"id": f"d{first + i}", "text": sentence_text(first + i)}) for i in range(5)]
    lines += [json.dumps({"id": f"short{first}", "text": "Too short."}), '{"id": "cut", "text": "no end']
    data = ("\n".join(lines) + "\n").encode()
    return zstandard.ZstdCompressor().compress(data) if name.endswith(".zst") else data


@pytest.fixture(scope="module")
def corpus(s3_server, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The shards in the bucket (their s3:// location) and the same files on disk. The store is
    configured as an operator would: AWS variables, which the Ray workers started here inherit."""
    import ray

    from moe_dag.engine import RayConfig, connect

    local = tmp_path_factory.mktemp("corpus")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        for name in SHARDS:
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(shard_bytes(name))
            fs.pipe(f"{BUCKET}/{SOURCE}/{name}", shard_bytes(name))
        # A Ray started before the AWS variables were set would give its workers none.
        ray.shutdown()
        connect(RayConfig(num_cpus=2, object_store_gb=0.25))
        try:
            yield f"s3://{BUCKET}/{SOURCE}", local
        finally:
            ray.shutdown()  # later tests start theirs, with their own environment
            s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def fsspec_settings() -> Iterator[None]:
    """fsspec's S3 settings (and their variable) as they were before the test changed them."""
    import fsspec

    saved, variable = fsspec.config.conf.get("s3"), os.environ.get(S3_CONFIG_ENV)
    yield
    fsspec.config.conf.pop("s3", None)
    if saved is not None:
        fsspec.config.conf["s3"] = saved
    os.environ.pop(S3_CONFIG_ENV, None)
    if variable is not None:
        os.environ[S3_CONFIG_ENV] = variable
    s3fs.S3FileSystem.clear_instance_cache()


def pipeline_config(tmp_path: Path, shards: str) -> Path:
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [{"name": SOURCE, "kind": "reference", "shards": shards, "languages": None}],
        "mixture": {"seq_len": 16, "total_tokens": 1000},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def materialize(config_path: Path, keys: list[str]) -> dg.ExecuteInProcessResult:
    defs = build_definitions(str(config_path))
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=keys,
        partition_key=SOURCE,
        instance=dg.DagsterInstance.ephemeral(),
        resources=defs.resources,
        raise_on_error=False,
    )


def only_failure(result: dg.ExecuteInProcessResult) -> str:
    """The one error of a failed run, as its user reads it: the exception raised in the asset."""
    failures = [event for event in result.all_events if event.is_step_failure]
    assert len(failures) == 1, [event.message for event in failures]
    error = failures[0].step_failure_data.error
    while error.cls_name != "ObjectStoreError" and error.cause is not None:  # Dagster's wrapper first
        error = error.cause
    assert error.cls_name == "ObjectStoreError", error.to_string()
    assert error.cause is None and error.context is None, "one message, not botocore's traceback"
    return error.message.strip().removeprefix("moe_dag.storage.object_store.")


def assert_nothing_written(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    written = [path for path in lake.rglob("*") if path.is_file()] if lake.exists() else []
    assert not [path for path in written if "raw_documents" in path.parts or "quarantine" in path.parts]


@pytest.mark.slow
def test_raw_documents_and_prefiltered_read_shards_from_s3_as_from_disk(corpus, tmp_path):
    location, local = corpus
    result = materialize(pipeline_config(tmp_path, location), ["raw_documents", "prefiltered"])
    assert result.success
    assert all(check.passed for check in result.get_asset_check_evaluations())

    lake = Lake(tmp_path / "lake")
    from_disk = read_shards([str(local / name) for name in SHARDS], SOURCE)
    documents = lake.read_table("raw_documents", SOURCE, ["id", "shard", "line"])
    assert sorted(documents["id"].to_pylist()) == sorted(from_disk.documents["id"].to_pylist())
    assert set(documents["shard"].to_pylist()) == {f"{location}/{name}" for name in SHARDS}
    quarantined = lake.read_table("quarantine", SOURCE, ["line"])
    assert quarantined.num_rows == from_disk.quarantine.num_rows == len(SHARDS)

    raw = [record["counts"] for record in lake.records("raw_documents", SOURCE).values()]
    assert sum(c["records"] for c in raw) == sum(c["kept"] + c["quarantined"] for c in raw) == 14
    decided = [record["counts"] for record in lake.records("prefiltered", SOURCE).values()]
    assert sum(c["documents"] for c in decided) == documents.num_rows
    assert sum(c["kept"] + c["dropped"] for c in decided) == documents.num_rows
    prefiltered = lake.read_table("prefiltered", SOURCE, ["id", "keep"])
    assert sorted(prefiltered["id"].to_pylist()) == sorted(documents["id"].to_pylist())
    dropped = {row["id"] for row in prefiltered.to_pylist() if not row["keep"]}
    assert {f"{SOURCE}/short0", f"{SOURCE}/short10"} <= dropped


def listing_failure(result: dg.ExecuteInProcessResult, location: str) -> str:
    """The one failure's message, which says the source's shards could not be listed."""
    message = only_failure(result)
    assert message.startswith(
        f"ObjectStoreError: source '{SOURCE}': could not list the shards under {location}:"
    )
    return message


def test_refused_credentials_fail_the_source_once_and_write_nothing(s3_server, corpus, tmp_path, monkeypatch):
    location, _ = corpus
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    s3fs.S3FileSystem.clear_instance_cache()
    s3_server.require_credentials(True)
    try:
        result = materialize(pipeline_config(tmp_path, location), ["raw_documents", "prefiltered"])
    finally:
        s3_server.require_credentials(False)
        s3fs.S3FileSystem.clear_instance_cache()
    assert not result.success
    message = listing_failure(result, location)
    assert f"the endpoint {s3_server.endpoint} refused the credentials" in message
    assert "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in message
    assert_nothing_written(tmp_path)


def test_an_unreachable_endpoint_fails_the_source_once_and_writes_nothing(corpus, tmp_path, monkeypatch):
    location, _ = corpus
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        result = materialize(pipeline_config(tmp_path, location), ["raw_documents"])
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    message = listing_failure(result, location)
    assert f"cannot connect to the endpoint {closed}" in message
    assert "check AWS_ENDPOINT_URL" in message
    assert_nothing_written(tmp_path)


def test_a_stalled_store_fails_listings_and_reads_within_the_timeouts(
    s3_server, corpus, tmp_path, fsspec_settings
):
    location, _ = corpus
    lake_url = f"s3://{BUCKET}/lake-{tmp_path.name}"
    written = Lake(lake_url).write_table(
        read_shard(f"{location}/{SHARDS[0]}", SOURCE).documents, "raw_documents", SOURCE
    )
    # The pipeline config's setting, as loading the config applies it.
    config = load_config(edited_config(pipeline_config(tmp_path, location), {"object_store": TIMEOUTS}))
    assert fsspec_s3_timeouts() == (TIMEOUTS["connect_timeout_s"], TIMEOUTS["read_timeout_s"])
    assert config.object_store.attempts == 1
    s3fs.S3FileSystem.clear_instance_cache()
    calls = {
        "list the shards under": lambda: list_shards(location),
        "read the shard": lambda: read_shard(f"{location}/{SHARDS[1]}", SOURCE),
        "list": lambda: Lake(lake_url).parquet_files("raw_documents", SOURCE),
        "read": lambda: Lake(lake_url).read_file(written),
    }
    os.kill(s3_server.process.pid, signal.SIGSTOP)
    try:
        for operation, call in calls.items():
            started = time.monotonic()
            with pytest.raises(ObjectStoreError) as raised:
                call()
            # s3fs tries a timed-out call 5 times: 5 x 0.3 s and its waits between tries (about 1 s).
            assert time.monotonic() - started < 30, operation
            message = str(raised.value)
            assert message.startswith(f"could not {operation} s3://{BUCKET}/"), message
            assert f"no reply from the endpoint {s3_server.endpoint}" in message
            assert "read 0.3 s" in message and "raise object_store.read_timeout_s" in message
    finally:
        os.kill(s3_server.process.pid, signal.SIGCONT)


def fsspec_s3_timeouts() -> tuple[float, float]:
    import fsspec

    settings = fsspec.config.conf["s3"]["config_kwargs"]
    assert json.loads(os.environ[S3_CONFIG_ENV]) == settings  # what the processes started here read
    return settings["connect_timeout"], settings["read_timeout"]
