"""Scale: do the dedup stages stay flat in memory and linear in time as the corpus grows?

Input: the demo corpus, ingested, its signatures computed once, then the whole of it repeated 1x, 4x and
16x with new ids (`<id>~<copy>`, new shard keys), as signature files and as the `prefiltered` shards the
apply stage reads (all documents kept). Each copy is an exact duplicate of the 1x text, as in issue 19's
measurements.

1. Clustering (`dedup_clusters`): `cluster_partitioned` as Ray tasks on a local Ray of `--workers` CPUs,
   against the named baseline `single_process`: today's `find_duplicate_clusters` (DuckDB and numpy
   union-find in one process) on the same signature files. Both outputs are compared row for row.
2. Apply (`deduplicated`): the stage's shard work (`DedupWork`, one cluster file per shard) on the same
   Ray, every source one after another as the assets run them.

Each scale runs in a fresh process: its peak RSS is the driver's; the largest worker's is the peak RSS
sampled every 20 ms over the Ray worker processes below it. Fixed start-up is excluded from the times:
Ray is started and one task per CPU has run (so every worker process exists and has imported the
library) before the clock starts; what remains fixed per run (scheduling ~10 tasks per partition per
step) is included, so small scales look cheap. `time_ratio_16x` is 16x over 1x of clustering plus apply.

3. Apply per batch against cluster count: a synthetic clusters table of 10^4 .. 10^6 rows (one source,
   10,000 rows a shard file); ms per 2,048-row batch of today's path, `apply_dedup` against the source's
   whole table as each actor held it (`baseline_whole_table`), and of `ShardClusters`, which reads only
   the shard's file in step with the batch.

Clustering runs with `--part-rows` rows a part (default 2,000, so parts, not the task's memory, grow
with these small corpora as they do at scale with the library's default of 10^6).

Options: `--docs-per-source`, `--scales`, `--workers`, `--apply-clusters`, `--part-rows`; `--speedup`
adds clustering and apply at the largest scale on 1 worker, for `speedup_2_workers`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.data.dedup import MinHashConfig, ShardClusters, apply_dedup, compute_signatures
from moe_dag.data.dedup.partitioned import CLUSTERS_STAGE, cluster_file_name, plan_parts
from moe_dag.data.demo_corpus import DemoCorpusConfig, build_demo_corpus
from moe_dag.data.ingest import ingest_source
from moe_dag.data.lake import Lake

BATCH_ROWS = 2048
SHARD_ROWS = 10_000
REPEATS = 9
MIB = 1 << 20


def base_lake(work: Path, docs_per_source: int) -> tuple[Lake, list[str]]:
    """The demo corpus ingested, with each raw shard's signatures beside it."""
    build_demo_corpus(work / "corpus", DemoCorpusConfig(docs_per_source=docs_per_source, seed=0))
    lake = Lake(work / "base")
    sources = sorted(p.name for p in (work / "corpus").iterdir() if p.is_dir())
    config = MinHashConfig()
    for source in sources:
        ingest_source(lake, source, str(work / "corpus" / source), workers=0)
        for path in lake.parquet_files("raw_documents", source):
            key = posixpath.basename(path).removesuffix(".parquet")
            signatures = compute_signatures(lake.read_file(path, ["id", "source", "text"]), config)
            lake.write_file(signatures, lake.shard_path("minhash_signatures", source, key))
    return lake, sources


def repeated_lake(base: Lake, sources: list[str], copies: int, folder: Path) -> Lake:
    """The base lake's documents and signatures `copies` times, each copy with new ids and shard keys."""
    lake = Lake(folder)
    for source in sources:
        for path in base.parquet_files("raw_documents", source):
            key = posixpath.basename(path).removesuffix(".parquet")
            documents = base.read_file(path)
            signatures = base.read_file(base.shard_path("minhash_signatures", source, key))
            for copy in range(copies):
                for stage, table in (("prefiltered", documents), ("minhash_signatures", signatures)):
                    renamed = table.set_column(
                        table.schema.get_field_index("id"),
                        "id",
                        pc.binary_join_element_wise(table["id"], pa.scalar(f"~{copy}"), ""),
                    )
                    lake.write_file(renamed, lake.shard_path(stage, source, f"{key}-c{copy}"))
    return lake


MEASURE = r"""
import json, resource, sys, time
sys.path.insert(0, {here!r})
from scale import measure_scale
print(json.dumps(measure_scale({lake!r}, {sources!r}, {workers!r}, {baseline!r}, {part_rows!r})))
"""


def run_fresh(lake: Lake, sources: list[str], workers: int, baseline: bool, part_rows: int) -> dict:
    here = str(Path(__file__).parent)
    script = MEASURE.format(
        here=here, lake=lake.url, sources=sources, workers=workers, baseline=baseline, part_rows=part_rows
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"measuring {lake.url} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class WorkerPeak:
    """Samples the RSS of every process below this one (Ray's raylet, its workers) and keeps the
    largest single process's peak: Ray's worker processes (titled `ray::<task>`), not its daemons."""

    def __init__(self) -> None:
        import psutil

        self.psutil, self.me = psutil, psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for process in self.me.children(recursive=True):
                try:
                    if " ".join(process.cmdline()).startswith("ray::"):
                        self.peak = max(self.peak, process.memory_info().rss)
                except self.psutil.Error:
                    continue


def measure_scale(lake_url: str, sources: list[str], workers: int, baseline: bool, part_rows: int) -> dict:
    """In a fresh process: clustering and apply on a warm local Ray; or, with `baseline`, today's
    single-process clustering alone."""
    import resource

    from moe_dag.data.dedup import cluster_partitioned, find_duplicate_clusters

    lake = Lake(lake_url)
    config = MinHashConfig()
    documents = sum(
        pq.ParquetFile(p).metadata.num_rows
        for s in sources
        for p in lake.parquet_files("minhash_signatures", s)
    )
    if baseline:
        files = [posixpath.join(lake.dataset_dir("minhash_signatures", s), "*.parquet") for s in sources]
        started = time.perf_counter()
        clusters = find_duplicate_clusters(files, config, sources)
        seconds = time.perf_counter() - started
        written = lake.read_table(CLUSTERS_STAGE)
        same = sorted(
            clusters.select(["id", "cluster_id", "match"]).to_pylist(), key=lambda r: r["id"]
        ) == sorted(written.select(["id", "cluster_id", "match"]).to_pylist(), key=lambda r: r["id"])
        return {
            "documents": documents,
            "cluster_s": seconds,
            "driver_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "equal_to_partitioned": same,
        }
    import ray

    from moe_dag.data.dedup import cluster_versions
    from moe_dag.data.engine import RayConfig, StageSpec, connect, run_stage
    from moe_dag.data.engine.shards import ShardInput
    from moe_dag.data.engine.stages import DedupWork

    connect(RayConfig(num_cpus=workers))
    # Every worker process started and the library imported, before the clock starts.
    ray.get([ray.remote(plan_parts).remote([], 1) for _ in range(workers)])
    result = {"documents": documents}
    with WorkerPeak() as peak:
        started = time.perf_counter()
        clustered = cluster_partitioned(lake, sources, config, workers=workers, part_rows=part_rows)
        result["cluster_s"] = time.perf_counter() - started
    result.update(
        cluster_worker_rss_mib=peak.peak / MIB,
        rounds=clustered.rounds,
        duplicates=clustered.report.duplicates,
    )
    shutil.rmtree(lake.dataset_dir("deduplicated"), ignore_errors=True)  # an earlier run's output
    with WorkerPeak() as peak:
        started = time.perf_counter()
        for source in sources:
            version = cluster_versions(
                posixpath.join(lake.dataset_dir(CLUSTERS_STAGE), f"{source}.*.parquet")
            )
            spec = StageSpec(
                outputs=("deduplicated",),
                make_work=functools.partial(DedupWork, version[source]),
                params=version[source],
            )
            inputs = [
                ShardInput(key=posixpath.basename(p).removesuffix(".parquet"), path=p, fingerprint="scale")
                for p in lake.parquet_files("prefiltered", source)
            ]
            run_stage(spec, lake, source, inputs, workers=workers)
        result["apply_s"] = time.perf_counter() - started
    result["apply_worker_rss_mib"] = peak.peak / MIB
    result["driver_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def apply_per_batch(
    folder: Path, clusters: int, baseline_batches: int, batches: int = 5
) -> tuple[float, float]:
    """ms per 2,048-row batch: (whole table per actor, shard file in step), at `clusters` cluster rows."""
    lake = Lake(folder / f"clusters-{clusters}")
    ids = pa.array([f"web/d{i:09d}" for i in range(clusters)], pa.string())
    rng = np.random.default_rng(0)
    survivor = rng.random(clusters) > 0.1
    table = pa.table(
        {
            "id": ids,
            "source": pa.array(["web"] * clusters, pa.string()),
            "cluster_id": ids,
            "is_survivor": survivor,
            "duplicate_of": pa.array([None] * clusters, pa.string()),
            "match": pa.array(np.where(survivor, None, "near"), pa.string()),
            "jaccard": pa.array(np.where(survivor, np.nan, 0.9), pa.float32()),
        }
    )
    for start in range(0, clusters, SHARD_ROWS):
        path = posixpath.join(
            lake.dataset_dir(CLUSTERS_STAGE), cluster_file_name("web", f"s{start // SHARD_ROWS}")
        )
        lake.write_file(table.slice(start, SHARD_ROWS), path)
    shard = table.slice(0, min(SHARD_ROWS, clusters)).select(["id", "source"])
    shard = shard.append_column("text", pa.array(["a document"] * shard.num_rows, pa.string()))

    baseline_batches = min(baseline_batches, shard.num_rows // BATCH_ROWS)
    started = time.perf_counter()
    for b in range(baseline_batches):
        apply_dedup(shard.slice(b * BATCH_ROWS, BATCH_ROWS), table)
    whole = (time.perf_counter() - started) / baseline_batches * 1000

    path = posixpath.join(lake.dataset_dir(CLUSTERS_STAGE), cluster_file_name("web", "s0"))
    batches = min(batches, shard.num_rows // BATCH_ROWS)
    timings = []
    for _ in range(REPEATS):  # the median of several passes: one pass is a few ms on a shared machine
        started = time.perf_counter()
        step = ShardClusters(path, lake.fs, "version")
        for b in range(batches):
            step.apply(shard.slice(b * BATCH_ROWS, BATCH_ROWS))
        timings.append((time.perf_counter() - started) / batches * 1000)
    in_step = float(np.median(timings))
    return whole, in_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-source", type=int, default=1000)
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--apply-clusters", default="10000,100000,1000000")
    parser.add_argument("--part-rows", type=int, default=2000)
    parser.add_argument("--speedup", action="store_true")
    args = parser.parse_args()
    scales = [int(s) for s in args.scales.split(",")]

    summary: dict = {"bench": "scale", "baseline": "single_process", "workers": args.workers}
    with tempfile.TemporaryDirectory(prefix="scale-") as folder:
        work = Path(folder)
        base, sources = base_lake(work, args.docs_per_source)
        measured = {}
        for copies in scales:
            lake = repeated_lake(base, sources, copies, work / f"lake-{copies}x")
            row = run_fresh(lake, sources, args.workers, baseline=False, part_rows=args.part_rows)
            row["baseline"] = run_fresh(lake, sources, args.workers, baseline=True, part_rows=args.part_rows)
            measured[copies] = row
            b = row["baseline"]
            print(
                f"{copies:>2}x {row['documents']:>7} documents: clustering {row['cluster_s']:.2f} s "
                f"({row['rounds']} label rounds; single process {b['cluster_s']:.2f} s, equal: "
                f"{b['equal_to_partitioned']}), apply {row['apply_s']:.2f} s; peak RSS driver "
                f"{row['driver_rss_mib']:.0f} MiB (single process {b['driver_rss_mib']:.0f}), largest worker "
                f"{row['cluster_worker_rss_mib']:.0f} MiB clustering, "
                f"{row['apply_worker_rss_mib']:.0f} MiB apply"
            )
        if args.speedup:
            largest = scales[-1]
            one = run_fresh(
                Lake(work / f"lake-{largest}x"), sources, 1, baseline=False, part_rows=args.part_rows
            )
            both = measured[largest]
            speedup = (one["cluster_s"] + one["apply_s"]) / (both["cluster_s"] + both["apply_s"])
            print(
                f"{largest}x on 1 worker: clustering {one['cluster_s']:.2f} s, apply {one['apply_s']:.2f} s"
            )
            summary[f"speedup_{args.workers}_workers"] = round(speedup, 3)
            summary["speedup_documents"] = both["documents"]

        sizes = [int(c) for c in args.apply_clusters.split(",")]
        per_batch = {}
        for clusters in sizes:
            whole, in_step = apply_per_batch(work, clusters, baseline_batches=2 if clusters >= 10**6 else 5)
            per_batch[clusters] = (whole, in_step)
            print(
                f"apply at {clusters:>9} cluster rows: {in_step:6.1f} ms per {BATCH_ROWS}-row batch "
                f"(whole table per actor: {whole:8.1f} ms)"
            )

    first, last = measured[scales[0]], measured[scales[-1]]
    total = lambda row: row["cluster_s"] + row["apply_s"]  # noqa: E731
    summary.update(
        {
            "scales": scales,
            "documents": {str(k): v["documents"] for k, v in measured.items()},
            "cluster_s": {str(k): round(v["cluster_s"], 3) for k, v in measured.items()},
            "apply_s": {str(k): round(v["apply_s"], 3) for k, v in measured.items()},
            "baseline_cluster_s": {str(k): round(v["baseline"]["cluster_s"], 3) for k, v in measured.items()},
            "driver_rss_mib": {str(k): round(v["driver_rss_mib"], 1) for k, v in measured.items()},
            "baseline_rss_mib": {
                str(k): round(v["baseline"]["driver_rss_mib"], 1) for k, v in measured.items()
            },
            "worker_rss_mib": {
                str(k): round(max(v["cluster_worker_rss_mib"], v["apply_worker_rss_mib"]), 1)
                for k, v in measured.items()
            },
            "equal_to_single_process": all(v["baseline"]["equal_to_partitioned"] for v in measured.values()),
            f"driver_rss_ratio_{scales[-1]}x": round(last["driver_rss_mib"] / first["driver_rss_mib"], 3),
            f"worker_rss_ratio_{scales[-1]}x": round(
                max(last["cluster_worker_rss_mib"], last["apply_worker_rss_mib"])
                / max(first["cluster_worker_rss_mib"], first["apply_worker_rss_mib"]),
                3,
            ),
            f"time_ratio_{scales[-1]}x": round(total(last) / total(first), 3),
            # Time per added document between consecutive scales: flat when the cost is linear.
            "marginal_ms_per_document": {
                f"{a}x-{b}x": round(
                    (total(measured[b]) - total(measured[a]))
                    / (measured[b]["documents"] - measured[a]["documents"])
                    * 1000,
                    4,
                )
                for a, b in zip(scales, scales[1:], strict=False)
            },
            f"baseline_time_ratio_{scales[-1]}x": round(
                last["baseline"]["cluster_s"] / first["baseline"]["cluster_s"], 3
            ),
            "apply_ms_per_batch": {str(k): round(v[1], 2) for k, v in per_batch.items()},
            "baseline_apply_ms_per_batch": {str(k): round(v[0], 2) for k, v in per_batch.items()},
        }
    )
    if 10**6 in per_batch:
        summary["dedup_apply_ms_per_batch_at_1e6_clusters"] = round(per_batch[10**6][1], 2)
        summary["baseline_dedup_apply_ms_per_batch_at_1e6_clusters"] = round(per_batch[10**6][0], 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
