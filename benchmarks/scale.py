"""Scale: does every data stage stay flat in memory and linear in time as the corpus grows?

Input: the demo corpus (`--docs-per-source`, three sources) repeated 1x, 4x and 16x as raw shards. Copy 0
is the corpus itself; copy c > 0 of a document has a new id (`<id>~<c>`) and its text spliced from the
first half of the document and the second half of the c-th next document of the same shard (split at
the line, else the word, nearest the middle). A copy shares about a third of its word 5-grams with any
other copy or original, under the 0.8 Jaccard of the dedup stage, so every copy passes dedup like a new
document and the stages after dedup grow with the corpus too (exact copies would leave them 1x work).

Each scale runs every data stage from raw shards to packed sequences on a fresh lake, in a fresh process,
on a local Ray of `--workers` CPUs, each stage as its asset runs it: the engine's `run_stage` with the
stage's `StageSpec` for the per-source stages (the sources one after another), the library call of the
asset for the others.

- `raw_documents`: `ingest_source`;
- `prefiltered`: the perplexity fit in tasks (`fit_source_in_tasks`, stored), then the filters;
- `minhash_signatures`, `deduplicated` (the shard's cluster file in step, `DedupWork`), `toxicity_filtered`;
- `dedup_clusters`: `cluster_partitioned` with `--part-rows` rows a part (default 2,000, so parts, not a
  task's memory, grow with these small corpora, as they do at scale with the library's 10^6);
- `tokenizer`: `train_curated_tokenizer`; `tokenized_mixture`: `build_curated_mixture` (token shards per
  scored shard by the engine, the index-level plan drawn here, the rows packed from it by tasks), with
  the demo config's token budget times the scale, so packing grows with the corpus.

Left out: scoring. It needs oracle labels and heads trained first (steps that do not grow with the
corpus), and on CPU the backbone scores ~61 documents a second a core (benchmarks/scoring.py, one pinned
core), so 16x's ~33,000 documents would add ~5 minutes of both cores when quiet and far more under load;
at scale its cost is the GPU rate of benchmarks/scoring_gpu.py. In its place, outside the totals, a stand-in
`scored_documents` that keeps every document toxicity kept (the engine's `FilterWork` with no filters),
for the tokenizer and the mixture to read. Also left out: the assets' metadata and checks (counts by
tasks, DuckDB counts), and `neutral_documents` (no neutral set is drawn; nothing is excluded).

Measured per stage: seconds, the driver's largest RSS and the largest Ray worker process's peak RSS
(sampled every 20 ms over the processes below the driver titled `ray::`); per scale, the driver's peak RSS
over the whole run (`ru_maxrss`) and the largest worker's. Fixed start-up is excluded: Ray is started
and one task per CPU has run (every worker process exists and has imported the library) before the first
clock starts. What is fixed per stage run remains in the times (task scheduling, the language ID model and
the toxicity classifier loading once per worker process), so small scales look cheap; the marginal
cost per added document is the figure to scale with. `time_ratio_16x` is 16x over 1x of the sum over
stages.

Also, as before: each scale's partitioned clusters against the named baseline `single_process`
(`find_duplicate_clusters`, DuckDB and a numpy union-find in one process, on the same signature files,
compared row for row); ms per 2,048-row batch of the dedup apply against the cluster count (a synthetic
clusters table of 10^4 .. 10^6 rows, 10,000 rows a shard file) for `ShardClusters` (the shard's file in
step with the batch) and for the old `apply_dedup` against the source's whole table
(`baseline_whole_table`); unless `--no-speedup`, the whole pipeline at the largest scale on 1 worker
once more, for `speedup_2_workers` (so that `make bench` records it; the smoke size skips it).

Options: `--docs-per-source`, `--scales`, `--workers`, `--apply-clusters`, `--part-rows`,
`--[no-]speedup`, `--config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import os
import posixpath
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import zstandard

from benchmarks._smoke import parse_with_smoke
from moe_dag.curation.dedup import ShardClusters, apply_dedup
from moe_dag.curation.dedup.partitioned import CLUSTERS_STAGE, cluster_file_name
from moe_dag.curation.demo_corpus import DemoCorpusConfig, build_demo_corpus
from moe_dag.storage.lake import Lake

BATCH_ROWS = 2048
SHARD_ROWS = 10_000
REPEATS = 9
MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
# The stages measured, in the order they run; their times add up to the totals.
STAGES = (
    "raw_documents",
    "prefiltered",
    "minhash_signatures",
    "dedup_clusters",
    "deduplicated",
    "toxicity_filtered",
    "tokenizer",
    "tokenized_mixture",
)
STAND_IN = "scored_documents"  # run between toxicity and the tokenizer, not counted


def _read_lines(path: Path) -> list[str]:
    data = path.read_bytes()
    data = (
        zstandard.ZstdDecompressor().decompressobj().decompress(data)
        if path.suffix == ".zst"
        else gzip.decompress(data)
    )
    return data.decode("utf-8").splitlines()


def _write_lines(path: Path, lines: list[str]) -> None:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(
        zstandard.ZstdCompressor().compress(data) if path.suffix == ".zst" else gzip.compress(data, mtime=0)
    )


def _halves(text: str) -> tuple[str, str]:
    """The text cut at the line break nearest its middle, else at the space nearest it."""
    middle = len(text) // 2
    for separator in ("\n", " "):
        cuts = [cut for cut in (text.rfind(separator, 0, middle), text.find(separator, middle)) if cut > 0]
        if cuts:
            cut = min(cuts, key=lambda i: abs(i - middle))
            return text[:cut], text[cut:]
    return text[:middle], text[middle:]


def spliced_copy(lines: list[str], copy: int) -> list[str]:
    """Copy `copy` of a shard's lines: each record's id suffixed, its text the first half of its own and
    the second half of the record `copy` places on (module docstring). Lines that are not records (the
    corpus's planted malformed lines) stay as they are, to be quarantined again."""
    records = {}
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            records[number] = record
    numbers = sorted(records)
    halves = [_halves(records[number]["text"]) for number in numbers]
    out = list(lines)
    for position, number in enumerate(numbers):
        record = dict(records[number])
        record["id"] = f"{record['id']}~{copy}"
        record["text"] = halves[position][0] + halves[(position + copy) % len(numbers)][1]
        out[number] = json.dumps(record, ensure_ascii=False)
    for number, line in enumerate(lines):  # records without text keep their line, with a new id
        if number not in records:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "id" in record:
                out[number] = json.dumps({**record, "id": f"{record['id']}~{copy}"}, ensure_ascii=False)
    return out


def repeated_corpus(corpus: Path, sources: list[str], copies: int, folder: Path) -> Path:
    """The corpus's raw shards `copies` times: copy 0 as it is, the others spliced with new ids."""
    for source in sources:
        (folder / source).mkdir(parents=True, exist_ok=True)
        for shard in sorted((corpus / source).iterdir()):
            lines = _read_lines(shard)
            stem, suffixes = shard.name.split(".", 1)
            for copy in range(copies):
                _write_lines(
                    folder / source / f"{stem}-c{copy}.{suffixes}",
                    spliced_copy(lines, copy) if copy else lines,
                )
    return folder


MEASURE = r"""
import json, sys
sys.path.insert(0, {root!r})
from benchmarks.scale import {function}
print(json.dumps({function}(**{kwargs!r})))
"""


def run_fresh(function: str, **kwargs: object) -> dict:
    """`function(**kwargs)` of this module in a fresh Python process (its own peak RSS, its own Ray)."""
    script = MEASURE.format(root=str(ROOT), function=function, kwargs=kwargs)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{function}({kwargs}) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class Peaks:
    """Samples every 20 ms the RSS of this process and of every process below it titled `ray::` (Ray's
    worker processes, not its daemons), keeping the largest of each since the last `take`."""

    def __init__(self) -> None:
        import psutil

        self.psutil, self.me = psutil, psutil.Process()
        self.worker = self.driver = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> tuple[float, float]:
        """(largest worker, driver) peaks in MiB since the last call, sampling once more first."""
        self._sample()
        peaks = self.worker / MIB, self.driver / MIB
        self.worker = self.driver = 0
        return peaks

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def _sample(self) -> None:
        self.driver = max(self.driver, self.me.memory_info().rss)
        for process in self.me.children(recursive=True):
            try:
                if " ".join(process.cmdline()).startswith("ray::"):
                    self.worker = max(self.worker, process.memory_info().rss)
            except self.psutil.Error:
                continue


def measure_pipeline(
    corpus: str, lake_dir: str, config_path: str, workers: int, part_rows: int, copies: int
) -> dict:
    """In a fresh process: every stage of the module docstring over `corpus` into a new lake at
    `lake_dir`, on a warm local Ray of `workers` CPUs."""
    import resource

    import ray

    from moe_dag.config import load_config
    from moe_dag.curation.dedup import cluster_partitioned
    from moe_dag.curation.dedup.partitioned import plan_parts, recorded_versions
    from moe_dag.curation.filters import build_prefilters, build_toxicity_filters
    from moe_dag.curation.fits import fit_source_in_tasks, store_fit, with_fit
    from moe_dag.curation.ingest import ingest_source
    from moe_dag.curation.work import DedupWork, FilterWork, SignatureWork
    from moe_dag.engine import RayConfig, StageSpec, connect, run_stage, upstream_inputs
    from moe_dag.mixture.curated import build_curated_mixture, train_curated_tokenizer
    from moe_dag.settings.curation import prefilter_settings, toxicity_settings
    from moe_dag.settings.stage import work_digest

    config = load_config(config_path)
    lake, names = Lake(lake_dir), config.source_names
    blocks = config.ray.min_block_rows

    def run(spec: StageSpec, source: str, inputs: list) -> object:
        return run_stage(spec, lake, source, inputs, workers=workers, min_block_rows=blocks)

    def per_source(make_spec: Callable[[object], StageSpec], upstream: str) -> Callable[[], dict]:
        def stage() -> dict:
            documents = 0
            for source in config.sources:
                documents += run(
                    make_spec(source), source.name, upstream_inputs(lake, upstream, source.name)
                ).documents_run
            return {"documents": documents}

        return stage

    def ingest() -> dict:
        runs = [ingest_source(lake, name, str(Path(corpus) / name), workers=workers) for name in names]
        return {
            "documents": sum(r.counts.get("records", 0) for r in runs),
            "kept": sum(r.counts.get("kept", 0) for r in runs),
        }

    def prefilter() -> dict:
        documents, fit_s = 0, 0.0
        for source in config.sources:  # as moe_dag/assets/prefilter.py, on a lake with no earlier fit
            settings = prefilter_settings(config, source.name)
            filters = build_prefilters(settings.filters, settings.kind, settings.languages)
            started = time.perf_counter()
            fit = fit_source_in_tasks(
                filters,
                lake,
                "raw_documents",
                source.name,
                settings.filters.perplexity.sample_documents,
                work_digest(settings),
                workers=workers,
            )
            store_fit(lake, "prefiltered", source.name, fit)
            fit_s += time.perf_counter() - started
            spec = StageSpec(
                outputs=("prefiltered",),
                make_work=functools.partial(
                    FilterWork, "prefiltered", functools.partial(list, with_fit(filters, fit))
                ),
                params=f"{work_digest(settings)} {fit.version}",
                warm=settings.languages is not None,
            )
            documents += run(
                spec, source.name, upstream_inputs(lake, "raw_documents", source.name)
            ).documents_run
        return {"documents": documents, "fit_s": round(fit_s, 3)}

    def cluster() -> dict:
        clustered = cluster_partitioned(lake, names, config.dedup, workers=workers, part_rows=part_rows)
        return {
            "documents": clustered.rows,
            "rounds": clustered.rounds,
            "duplicates": clustered.report.duplicates,
        }

    def dedup_apply() -> dict:
        recorded = recorded_versions(lake)
        documents = 0
        for name in names:  # as moe_dag/assets/dedup.py, every cluster file's version recorded
            versions = {
                key.removeprefix(f"{name}.").removesuffix(".parquet"): version
                for key, version in recorded.items()
                if key.startswith(f"{name}.")
            }
            inputs = [
                dataclasses.replace(shard, fingerprint=f"{shard.fingerprint} {versions[shard.key]}")
                for shard in upstream_inputs(lake, "prefiltered", name)
            ]
            spec = StageSpec(
                outputs=("deduplicated",),
                make_work=functools.partial(DedupWork, versions),
                params="shard cluster versions",
            )
            documents += run(spec, name, inputs).documents_run
        return {"documents": documents}

    mixture = dataclasses.replace(config.mixture, total_tokens=config.mixture.total_tokens * copies)

    def tokenizer() -> dict:
        return {"documents": train_curated_tokenizer(lake, names, mixture, config.tokenizer).documents}

    def pack() -> dict:
        report, _ = build_curated_mixture(lake, names, mixture, run)
        return {"tokens": report["total_tokens"], "sequences": report["num_sequences"]}

    stages = {
        "raw_documents": ingest,
        "prefiltered": prefilter,
        "minhash_signatures": per_source(
            lambda source: StageSpec(
                outputs=("minhash_signatures",),
                make_work=functools.partial(SignatureWork, config.dedup),
                params=repr(config.dedup),
            ),
            "prefiltered",
        ),
        "dedup_clusters": cluster,
        "deduplicated": dedup_apply,
        "toxicity_filtered": per_source(
            lambda source: StageSpec(
                outputs=("toxicity_filtered",),
                make_work=functools.partial(
                    FilterWork,
                    "toxicity_filtered",
                    functools.partial(
                        build_toxicity_filters,
                        toxicity_settings(config, source.name).filters,
                        source.kind,
                    ),
                ),
                params=work_digest(toxicity_settings(config, source.name)),
                warm=True,
            ),
            "deduplicated",
        ),
        STAND_IN: per_source(
            lambda source: StageSpec(
                outputs=(STAND_IN,),
                make_work=functools.partial(FilterWork, STAND_IN, list),  # no filters: keeps every row
                params="stand-in for scoring",
            ),
            "toxicity_filtered",
        ),
        "tokenizer": tokenizer,
        "tokenized_mixture": pack,
    }

    connect(RayConfig(num_cpus=workers))
    # Every worker process started and the library imported, before the first clock starts.
    ray.get([ray.remote(plan_parts).remote([], 1) for _ in range(workers)])
    result: dict = {"stages": {}}
    with Peaks() as peaks:
        peaks.take()
        for name, stage in stages.items():
            started = time.perf_counter()
            figures = stage()
            seconds = time.perf_counter() - started
            worker_mib, driver_mib = peaks.take()
            result["stages"][name] = {
                "s": round(seconds, 3),
                "worker_rss_mib": round(worker_mib, 1),
                "driver_rss_mib": round(driver_mib, 1),
                **figures,
            }
    result["documents"] = result["stages"]["raw_documents"]["documents"]
    result["driver_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["worker_rss_mib"] = max(s["worker_rss_mib"] for s in result["stages"].values())
    return result


def measure_reference(lake_dir: str, config_path: str) -> dict:
    """In a fresh process: the single-process clustering on the lake's signature files, against the
    partitioned clusters written there."""
    import resource

    from moe_dag.config import load_config
    from moe_dag.curation.dedup import find_duplicate_clusters

    config = load_config(config_path)
    lake, names = Lake(lake_dir), config.source_names
    files = [posixpath.join(lake.dataset_dir("minhash_signatures", name), "*.parquet") for name in names]
    started = time.perf_counter()
    clusters = find_duplicate_clusters(files, config.dedup, names)
    seconds = time.perf_counter() - started
    written = lake.read_table(CLUSTERS_STAGE)
    key = lambda row: row["id"]  # noqa: E731
    columns = ["id", "cluster_id", "match"]
    same = sorted(clusters.select(columns).to_pylist(), key=key) == sorted(
        written.select(columns).to_pylist(), key=key
    )
    return {
        "cluster_s": seconds,
        "driver_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "equal_to_partitioned": same,
    }


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


def stage_s(stage: str, row: dict) -> float:
    return row["stages"][stage]["s"]


def total_s(row: dict) -> float:
    return sum(stage_s(stage, row) for stage in STAGES)


def marginal_ms(measured: dict[int, dict], seconds: Callable[[dict], float]) -> dict[str, float]:
    """Seconds per added raw document between consecutive scales, in ms: flat when the cost is linear."""
    scales = sorted(measured)
    return {
        f"{a}x-{b}x": round(
            (seconds(measured[b]) - seconds(measured[a]))
            / (measured[b]["documents"] - measured[a]["documents"])
            * 1000,
            4,
        )
        for a, b in zip(scales, scales[1:], strict=False)
    }


def summarise(measured: dict[int, dict], one_worker: dict | None, workers: int, per_batch: dict) -> dict:
    scales = sorted(measured)
    first, last, top = measured[scales[0]], measured[scales[-1]], f"{scales[-1]}x"
    stages: dict = {}
    for stage in (*STAGES, STAND_IN):
        of = functools.partial(stage_s, stage)
        stages[stage] = {
            "s": {str(k): v["stages"][stage]["s"] for k, v in measured.items()},
            "documents": {str(k): v["stages"][stage].get("documents") for k, v in measured.items()},
            "worker_rss_mib": {str(k): v["stages"][stage]["worker_rss_mib"] for k, v in measured.items()},
            "driver_rss_mib": {str(k): v["stages"][stage]["driver_rss_mib"] for k, v in measured.items()},
            f"time_ratio_{top}": round(of(last) / of(first), 3),
            "marginal_ms_per_document": marginal_ms(measured, of),
        }
        if one_worker is not None:
            stages[stage][f"speedup_{workers}_workers"] = round(
                one_worker["stages"][stage]["s"] / of(last), 3
            )
    stages["prefiltered"]["fit_s"] = {
        str(k): v["stages"]["prefiltered"]["fit_s"] for k, v in measured.items()
    }
    summary = {
        "bench": "scale",
        "baseline": "single_process",
        "workers": workers,
        "scales": scales,
        "documents": {str(k): v["documents"] for k, v in measured.items()},
        "total_s": {str(k): round(total_s(v), 3) for k, v in measured.items()},
        "driver_rss_mib": {str(k): round(v["driver_rss_mib"], 1) for k, v in measured.items()},
        "worker_rss_mib": {str(k): round(v["worker_rss_mib"], 1) for k, v in measured.items()},
        f"driver_rss_ratio_{top}": round(last["driver_rss_mib"] / first["driver_rss_mib"], 3),
        f"worker_rss_ratio_{top}": round(last["worker_rss_mib"] / first["worker_rss_mib"], 3),
        f"time_ratio_{top}": round(total_s(last) / total_s(first), 3),
        "marginal_ms_per_document": marginal_ms(measured, total_s),
        "equal_to_single_process": all(v["reference"]["equal_to_partitioned"] for v in measured.values()),
        "baseline_cluster_s": {str(k): round(v["reference"]["cluster_s"], 3) for k, v in measured.items()},
        "baseline_rss_mib": {str(k): round(v["reference"]["driver_rss_mib"], 1) for k, v in measured.items()},
        "stages": stages,
        "apply_ms_per_batch": {str(k): round(v[1], 2) for k, v in per_batch.items()},
        "baseline_apply_ms_per_batch": {str(k): round(v[0], 2) for k, v in per_batch.items()},
    }
    if one_worker is not None:
        summary[f"speedup_{workers}_workers"] = round(total_s(one_worker) / total_s(last), 3)
        summary["speedup_documents"] = last["documents"]
    if 10**6 in per_batch:
        summary["dedup_apply_ms_per_batch_at_1e6_clusters"] = round(per_batch[10**6][1], 2)
        summary["baseline_dedup_apply_ms_per_batch_at_1e6_clusters"] = round(per_batch[10**6][0], 2)
    return summary


def describe(copies: int, row: dict) -> str:
    reference = row["reference"]
    lines = [
        f"{copies:>2}x {row['documents']:>7} raw documents: {total_s(row):.1f} s over the stages; peak RSS "
        f"driver {row['driver_rss_mib']:.0f} MiB, largest worker {row['worker_rss_mib']:.0f} MiB; clusters "
        f"equal to the single process's: {reference['equal_to_partitioned']} "
        f"(it took {reference['cluster_s']:.2f} s)"
    ]
    for stage, figures in row["stages"].items():
        note = " (stand-in, not counted)" if stage == STAND_IN else ""
        lines.append(
            f"    {stage:<20} {figures['s']:8.2f} s  worker {figures['worker_rss_mib']:6.0f} MiB  driver "
            f"{figures['driver_rss_mib']:6.0f} MiB{note}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-source", type=int, default=1000)
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--apply-clusters", default="10000,100000,1000000")
    parser.add_argument("--part-rows", type=int, default=2000)
    parser.add_argument("--speedup", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    args = parse_with_smoke(
        parser, {"docs_per_source": 60, "scales": "1", "apply_clusters": "10000", "speedup": False}
    )
    scales = [int(s) for s in args.scales.split(",")]
    config = str(Path(args.config).resolve())

    with tempfile.TemporaryDirectory(prefix="scale-") as folder:
        work = Path(folder)
        build_demo_corpus(work / "corpus", DemoCorpusConfig(docs_per_source=args.docs_per_source, seed=0))
        sources = sorted(p.name for p in (work / "corpus").iterdir() if p.is_dir())
        measured = {}
        for copies in scales:
            corpus = repeated_corpus(work / "corpus", sources, copies, work / f"corpus-{copies}x")
            lake = str(work / f"lake-{copies}x")
            row = run_fresh(
                "measure_pipeline",
                corpus=str(corpus),
                lake_dir=lake,
                config_path=config,
                workers=args.workers,
                part_rows=args.part_rows,
                copies=copies,
            )
            row["reference"] = run_fresh("measure_reference", lake_dir=lake, config_path=config)
            measured[copies] = row
            print(describe(copies, row), flush=True)
        one_worker = None
        if args.speedup:
            largest = scales[-1]
            one_worker = run_fresh(
                "measure_pipeline",
                corpus=str(work / f"corpus-{largest}x"),
                lake_dir=str(work / f"lake-{largest}x-1-worker"),
                config_path=config,
                workers=1,
                part_rows=args.part_rows,
                copies=largest,
            )
            print(
                f"{largest}x on 1 worker: {total_s(one_worker):.1f} s over the stages, against "
                f"{total_s(measured[largest]):.1f} s on {args.workers}",
                flush=True,
            )

        per_batch = {}
        for clusters in [int(c) for c in args.apply_clusters.split(",")]:
            whole, in_step = apply_per_batch(work, clusters, baseline_batches=2 if clusters >= 10**6 else 5)
            per_batch[clusters] = (whole, in_step)
            print(
                f"apply at {clusters:>9} cluster rows: {in_step:6.1f} ms per {BATCH_ROWS}-row batch "
                f"(whole table per actor: {whole:8.1f} ms)",
                flush=True,
            )

    print(json.dumps(summarise(measured, one_worker, args.workers, per_batch)))


if __name__ == "__main__":
    main()
