"""The data plane: the same stage on 1 or 2 Ray workers, after kill -9, with a new shard, on a Ray head."""

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe_dag.curation.filters import PrefilterConfig, build_prefilters
from moe_dag.curation.ingest import ingest_source
from moe_dag.curation.work import FilterWork
from moe_dag.engine import ShardStageError, StageSpec, run_stage, upstream_inputs
from moe_dag.storage.lake import Lake
from tests.local_processes import free_port

SENTENCES = [
    "The river was high after a week of rain, and the ferry did not run until Thursday.",
    "Most of the letters she kept were from her brother, who wrote every month from the coast.",
    "A good map shows what a traveller needs and leaves out everything else.",
    "The committee met twice before it agreed on the budget for the new library.",
    "He learned to bake bread from his grandmother, who never measured anything.",
    "Farmers in the valley grow apples, pears and a little wheat on the higher fields.",
    "The museum opens at ten and closes early on Sundays during the winter months.",
    "Our train left on time, but the connection in the next town was cancelled.",
    "She repaired the old radio with parts she found in a box in the attic.",
    "Children in the village walk to school along the road beside the canal.",
    "The report describes how the bridge was built and why it needed repairs so soon.",
    "Every spring the birds return to the marsh and nest among the tall reeds.",
    "The recipe calls for two onions, a clove of garlic and a handful of fresh herbs.",
    "After the storm the neighbours worked together to clear the fallen trees.",
    "The lecture covered the history of the harbour from the Roman period onwards.",
    "Tickets for the concert sold out within an hour of going on sale.",
    "His first novel was set in a small town much like the one where he grew up.",
    "The garden behind the house is quiet in the morning and full of light.",
    "They painted the kitchen a pale yellow and hung new curtains by the window.",
    "A long walk in the hills is the best cure for a restless mind.",
]


def write_corpus(folder, shards: int, docs: int, first: int = 0) -> None:
    """`shards` JSON-lines shards of `docs` English documents; every fifth is too short to keep."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(first, first + shards):
        lines = []
        for i in range(docs):
            picked = random.Random(f"{shard}/{i}").sample(SENTENCES, 1 if i % 5 == 0 else 8)
            lines.append(json.dumps({"id": f"s{shard}-d{i}", "text": "\n".join(picked)}))
        (folder / f"shard-{shard:03d}.jsonl").write_text("\n".join(lines) + "\n")


def prefilter_spec(languages=("en",)) -> StageSpec:
    config = PrefilterConfig()
    make_filters = functools.partial(build_prefilters, config, "web", list(languages))
    return StageSpec(
        outputs=("prefiltered",),
        make_work=functools.partial(FilterWork, "prefiltered", make_filters),
        params=repr((config, languages)),
        warm=True,
    )


def ingested(tmp_path, name: str, shards: int = 6, docs: int = 12) -> Lake:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_corpus(corpus, shards, docs)
    lake = Lake(tmp_path / name)
    ingest_source(lake, "web", str(corpus), workers=0)
    return lake


def sorted_rows(lake: Lake, stage: str) -> pa.Table:
    return lake.read_table(stage, "web").sort_by("id")


def test_one_and_two_ray_workers_give_identical_outputs(tmp_path, local_ray):
    outputs = {}
    for workers in (1, 2):
        lake = ingested(tmp_path, f"lake-{workers}")
        run = run_stage(
            prefilter_spec(), lake, "web", upstream_inputs(lake, "raw_documents", "web"), workers=workers
        )
        assert run.shards_run == 6 and run.counts["documents"] == 72
        outputs[workers] = sorted_rows(lake, "prefiltered")
    assert outputs[1].equals(outputs[2])
    reasons = set(outputs[1]["reason"].to_pylist())
    assert reasons == {None, "gopher_too_few_words"}  # the long ones kept, the short ones dropped


def test_a_new_shard_is_processed_alone(tmp_path):
    lake = ingested(tmp_path, "lake", shards=3)
    first = run_stage(prefilter_spec(), lake, "web", upstream_inputs(lake, "raw_documents", "web"), workers=0)
    before = lake.records("prefiltered", "web")

    write_corpus(tmp_path / "corpus", shards=1, docs=12, first=3)
    assert ingest_source(lake, "web", str(tmp_path / "corpus"), workers=0).shards_run == 1
    second = run_stage(
        prefilter_spec(), lake, "web", upstream_inputs(lake, "raw_documents", "web"), workers=0
    )
    assert (first.shards_run, second.shards_run) == (3, 1)
    after = lake.records("prefiltered", "web")
    assert {key: after[key] for key in before} == before  # the old shards' records are untouched
    assert sorted(after) == ["shard-000", "shard-001", "shard-002", "shard-003"]

    changed = prefilter_spec(languages=("en", "fr"))  # new parameters: every shard is redone
    assert (
        run_stage(changed, lake, "web", upstream_inputs(lake, "raw_documents", "web"), workers=0).shards_run
        == 4
    )


def test_an_unopenable_shard_fails_naming_its_file_while_bad_lines_reach_quarantine(tmp_path, local_ray):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, shards=2, docs=5)
    with open(corpus / "shard-000.jsonl", "a") as shard:
        shard.write('{"id": "broken", "text": \n')
    (corpus / "shard-009.jsonl.gz").write_bytes(b"this is not gzip")
    lake = Lake(tmp_path / "lake")
    with pytest.raises(ShardStageError, match="1 of 3 shards failed") as failure:
        ingest_source(lake, "web", str(corpus))
    assert str(corpus / "shard-009.jsonl.gz") in str(failure.value) and "not a valid gzip stream" in str(
        failure.value
    )
    assert sorted(lake.records("raw_documents", "web")) == ["shard-000", "shard-001"]  # the others are done
    bad = lake.read_table("quarantine", "web").to_pylist()
    assert [(row["shard"], row["line"]) for row in bad] == [(str(corpus / "shard-000.jsonl"), 6)]


def counting_spec(warm: bool, dies_on: str | None = None) -> StageSpec:
    """A stage that copies its input and says, per shard, which build of its work (process and build)
    did it; with `dies_on`, the worker process exits on that shard, as one killed for its memory would."""
    from moe_dag.engine import ShardWork
    from moe_dag.engine.stage import kept_batches

    class CountingWork(ShardWork):  # local, so Ray's workers get it by value
        def __init__(self) -> None:
            self.build = f"{os.getpid()}:{uuid.uuid4().hex}"

        def process(self, shard, out):
            if shard.key == dies_on:
                os._exit(1)
            writer, documents = out.table("prefiltered"), 0
            for batch in kept_batches(shard, out):
                writer.write(batch)
                documents += batch.num_rows
            return {"documents": documents, "builds": {self.build: 1}}

    return StageSpec(outputs=("prefiltered",), make_work=CountingWork, warm=warm)


def builds_by_process(lake: Lake, sources: list[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for source in sources:
        for record in lake.records("prefiltered", source).values():
            for build in record["counts"]["builds"]:
                found.setdefault(build.split(":")[0], set()).add(build)
    return found


def test_a_warm_work_is_built_once_per_worker_process_across_stage_runs(tmp_path, local_ray):
    """Two stage runs (two sources) of a warm spec: each worker process builds the work once and keeps
    it; a cold spec builds it for every shard."""
    lake = ingested(tmp_path, "lake")
    ingest_source(lake, "more", str(tmp_path / "corpus"), workers=0)
    spec = counting_spec(warm=True)
    for source in ("web", "more"):
        run_stage(spec, lake, source, upstream_inputs(lake, "raw_documents", source))
    warm = builds_by_process(lake, ["web", "more"])
    assert all(len(builds) == 1 for builds in warm.values()), warm
    # The second run's shards were done by the works the first run built: no process started for it.
    assert set().union(*builds_by_process(lake, ["more"]).values()) <= set().union(
        *builds_by_process(lake, ["web"]).values()
    )

    cold = ingested(tmp_path, "cold")
    run_stage(counting_spec(warm=False), cold, "web", upstream_inputs(cold, "raw_documents", "web"))
    assert sum(map(len, builds_by_process(cold, ["web"]).values())) == 6  # one build per shard


def test_a_one_cpu_task_tokenises_on_one_thread(local_ray):
    """Rayon sizes its pool to every core unless told: a task of one CPU must not start two more."""
    import ray

    def threads_started_by_encode_batch() -> int:  # defined here: pickled by value, not by module
        from tokenizers import Tokenizer, models, pre_tokenizers

        def threads() -> int:
            with open("/proc/self/status") as status:
                return int(status.read().split("Threads:")[1].split()[0])

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
        before = threads()
        tokenizer.encode_batch(["a task takes one CPU"] * 512)
        return threads() - before

    assert ray.get(ray.remote(num_cpus=1)(threads_started_by_encode_batch).remote()) <= 1


def test_a_task_returns_all_but_tiny_values_through_the_object_store(local_ray):
    """A shuffle's driver owns parts x parts shares: Ray keeps a return under its inline limit in the
    owner's own memory, so the workers lower that limit to INLINE_RETURN_BYTES."""
    import numpy as np
    import ray

    from moe_dag.engine.cluster import INLINE_RETURN_BYTES

    make = ray.remote(num_cpus=1)(lambda size: np.zeros(size, dtype=np.uint8))
    tiny, share = make.remote(INLINE_RETURN_BYTES // 4), make.remote(10 * INLINE_RETURN_BYTES)
    ray.wait([tiny, share], num_returns=2)
    locations = ray.experimental.get_object_locations([tiny, share])
    assert locations[tiny]["node_ids"] == []  # inline, in this process
    assert locations[share]["node_ids"]  # in a node's object store; Ray's default would inline it


def test_a_shard_that_kills_its_worker_fails_naming_its_file(tmp_path, local_ray):
    lake = ingested(tmp_path, "lake", shards=3, docs=4)
    inputs = upstream_inputs(lake, "raw_documents", "web")
    with pytest.raises(ShardStageError, match="1 of 3 shards failed") as failure:
        run_stage(counting_spec(warm=True, dies_on="shard-001"), lake, "web", inputs, workers=2)
    assert f"shard {lake.shard_path('raw_documents', 'web', 'shard-001')}: its worker failed" in str(
        failure.value
    )
    assert sorted(lake.records("prefiltered", "web")) == ["shard-000", "shard-002"]  # the others are done


SLOW_STAGE = """
import dataclasses, functools, sys, time
from moe_dag.engine import RayConfig, connect, run_stage, upstream_inputs
from moe_dag.curation.work import FilterWork
from moe_dag.storage.lake import Lake
sys.path.insert(0, {tests!r})
from test_engine import prefilter_spec

class SlowFilterWork(FilterWork):
    def process(self, shard, out):
        time.sleep(1.0)
        return super().process(shard, out)

spec = prefilter_spec()
spec = dataclasses.replace(spec, make_work=functools.partial(SlowFilterWork, *spec.make_work.args))
connect(RayConfig(num_cpus=2, object_store_gb=0.25))
lake = Lake({lake!r})
run_stage(spec, lake, "web", upstream_inputs(lake, "raw_documents", "web"), workers=2)
"""


@pytest.mark.slow
def test_a_stage_killed_half_way_redoes_only_its_unfinished_shards(tmp_path):
    lake = ingested(tmp_path, "lake", shards=10, docs=8)
    script = SLOW_STAGE.format(tests=os.path.dirname(__file__), lake=lake.url)
    # Its own session, so killing the group takes Ray's processes with the driver.
    stage = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while len(lake.records("prefiltered", "web")) < 3:
        assert stage.poll() is None, stage.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the stage finished no shard in time"
        time.sleep(0.2)
    os.killpg(stage.pid, signal.SIGKILL)
    stage.wait()
    finished = lake.records("prefiltered", "web")
    assert 3 <= len(finished) < 10

    rerun = run_stage(prefilter_spec(), lake, "web", upstream_inputs(lake, "raw_documents", "web"), workers=0)
    assert rerun.shards_run == 10 - len(finished)
    assert {key: rerun.records[key] for key in finished} == finished
    uninterrupted = ingested(tmp_path, "uninterrupted", shards=10, docs=8)
    run_stage(
        prefilter_spec(),
        uninterrupted,
        "web",
        upstream_inputs(uninterrupted, "raw_documents", "web"),
        workers=0,
    )
    assert sorted_rows(lake, "prefiltered").equals(sorted_rows(uninterrupted, "prefiltered"))
    hidden = [p.name for p in (tmp_path / "lake" / "prefiltered" / "source=web").rglob(".*")]
    assert hidden == []  # the killed run's partial files are gone


BY_ADDRESS = """
import sys
sys.path.insert(0, {tests!r})
from moe_dag.engine import RayConfig, connect, run_stage, upstream_inputs
from moe_dag.storage.lake import Lake
from test_engine import prefilter_spec
import ray
print(connect(RayConfig(address={address!r})))
lake = Lake({lake!r})
run_stage(prefilter_spec(), lake, "web", upstream_inputs(lake, "raw_documents", "web"))
print("nodes", len(ray.nodes()))
"""


@pytest.mark.slow
def test_a_stage_runs_on_a_ray_head_by_address(tmp_path, local_ray):
    port = free_port()
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--object-store-memory=268435456", "--include-dashboard=false", f"--temp-dir=/tmp/moe-ray-{port}"],
        env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"},
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        remote = ingested(tmp_path, "remote")
        script = BY_ADDRESS.format(
            tests=os.path.dirname(__file__), address=f"127.0.0.1:{port}", lake=remote.url
        )
        ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert f":{port}: 2 CPUs" in ran.stdout and "nodes 1" in ran.stdout  # the head, not a local Ray
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(f"/tmp/moe-ray-{port}", ignore_errors=True)
    local = ingested(tmp_path, "local")
    run_stage(prefilter_spec(), local, "web", upstream_inputs(local, "raw_documents", "web"))
    assert sorted_rows(remote, "prefiltered").equals(sorted_rows(local, "prefiltered"))


def test_a_row_range_is_read_in_the_batches_of_the_whole_file(tmp_path):
    from moe_dag.engine.blocks import read_rows
    from moe_dag.storage.lake import read_batches

    lake, path = Lake(tmp_path / "lake"), str(tmp_path / "s0.parquet")
    with pq.ParquetWriter(path, pa.schema([("x", pa.int64())])) as w:
        first = 0
        for size in (1500, 1500, 0, 3000, 100):  # row groups that straddle the batches
            w.write_table(pa.table({"x": pa.array(range(first, first + size), pa.int64())}))
            first += size
    whole = [batch["x"].to_pylist() for batch in read_batches(path, lake.fs, batch_rows=2048)]
    assert [len(rows) for rows in whole] == [2048, 2048, 2004]
    assert [b["x"].to_pylist() for b in read_rows(path, lake.fs, (2048, 4096), batch_rows=2048)] == [whole[1]]
    assert [b["x"].to_pylist() for b in read_rows(path, lake.fs, (4096, 6100), batch_rows=2048)] == [whole[2]]
    assert [b.num_rows for b in read_rows(path, lake.fs, (0, 6100), batch_rows=1000)] == [1000] * 6 + [100]
    assert [b["x"].to_pylist() for b in read_rows(path, lake.fs, (3000, 3005))] == [list(range(3000, 3005))]


BIG_SHARD = 2048 + 300  # documents: two blocks of 2,048 rows at most


def big_shard(tmp_path, name: str) -> Lake:
    return ingested(tmp_path, name, shards=1, docs=BIG_SHARD)


def fitted_prefilter_spec(lake: Lake) -> StageSpec:
    """The prefilter fitted on the source once, as the asset does: an unfitted perplexity cut fits on
    the first batch each worker sees, which no split (or worker count) could reproduce."""
    from moe_dag.curation.filters import fit_to_source

    config = PrefilterConfig()
    filters = fit_to_source(
        build_prefilters(config, "web", ["en"]), lake.iter_batches("raw_documents", "web"), 500
    )
    return StageSpec(
        outputs=("prefiltered",),
        make_work=functools.partial(FilterWork, "prefiltered", functools.partial(list, filters)),
        params=repr(config),
        warm=True,
    )


def signature_spec() -> StageSpec:
    from moe_dag.curation.dedup import MinHashConfig
    from moe_dag.curation.work import SignatureWork

    return StageSpec(
        outputs=("minhash_signatures",), make_work=functools.partial(SignatureWork, MinHashConfig())
    )


@pytest.mark.slow
def test_one_large_shard_split_into_blocks_equals_the_unsplit_run(tmp_path, local_ray):
    """A source of one shard keeps two workers busy: its blocks run as tasks, with the work built per
    block (signatures) or kept by the worker (the prefilter), and the joined file and record equal the
    unsplit run's."""
    whole, blocks = big_shard(tmp_path, "whole"), big_shard(tmp_path, "blocks")
    prefilter = fitted_prefilter_spec(whole)
    for lake, workers, min_block_rows in ((whole, 0, None), (blocks, 2, 1000)):
        for spec, upstream in ((prefilter, "raw_documents"), (signature_spec(), "prefiltered")):
            inputs = upstream_inputs(lake, upstream, "web")
            run_stage(spec, lake, "web", inputs, workers=workers, min_block_rows=min_block_rows)
    for stage in ("prefiltered", "minhash_signatures"):
        [split_record] = blocks.records(stage, "web").values()
        [whole_record] = whole.records(stage, "web").values()
        assert split_record["blocks"] == 2 and "blocks" not in whole_record
        assert len(split_record["nodes"]) == 1  # the local Ray's one node ran the blocks and the join
        assert split_record["digest"] == whole_record["digest"]  # the next stage cannot tell
        ignored = ("filters", "seconds")  # timings
        assert {k: v for k, v in split_record["counts"].items() if k not in ignored} == {
            k: v for k, v in whole_record["counts"].items() if k not in ignored
        }
        split_file, whole_file = (lake.shard_path(stage, "web", "shard-000") for lake in (blocks, whole))
        assert pq.read_table(split_file).equals(pq.read_table(whole_file))
        layout = [pq.ParquetFile(path).metadata.num_row_groups for path in (split_file, whole_file)]
        assert layout[0] == layout[1]
        assert not (tmp_path / "blocks" / stage / "source=web" / "_blocks").exists()
    assert blocks.records("prefiltered", "web")["shard-000"]["counts"]["documents"] == BIG_SHARD


@pytest.mark.slow
def test_a_split_shard_redoes_only_its_unfinished_blocks(tmp_path, local_ray):
    """Blocks finished before a crash keep their records; the rerun runs the others, then joins."""
    from moe_dag.engine import process_shard
    from moe_dag.engine.blocks import split

    lake = big_shard(tmp_path, "lake")
    spec, [shard] = fitted_prefilter_spec(lake), upstream_inputs(lake, "raw_documents", "web")
    first, second = split(shard, BIG_SHARD, 2)
    assert (first.span, second.span) == ((0, 2048), (2048, BIG_SHARD))  # whole read batches
    # What a run killed before its first block finished left behind.
    assert "error" not in process_shard(spec, spec.make_work(), lake, "web", second)
    assert lake.records("prefiltered", "web") == {}  # no shard record before every block is in

    rerun = run_stage(spec, lake, "web", [shard], workers=2, min_block_rows=1000)
    assert rerun.documents_run == 2048  # the first block only
    whole = big_shard(tmp_path, "whole")
    run_stage(spec, whole, "web", upstream_inputs(whole, "raw_documents", "web"), workers=0)
    assert sorted_rows(lake, "prefiltered").equals(sorted_rows(whole, "prefiltered"))
    assert rerun.records["shard-000"]["counts"]["documents"] == BIG_SHARD
