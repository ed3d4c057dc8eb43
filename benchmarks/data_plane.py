"""The data plane: does a stage's memory stay flat as its source grows, and does its speed grow with cores?

Input: the demo corpus's `prose` source (real English text from Python's documentation), ingested into a
lake, and the same source repeated with new ids. The stage measured is `prefiltered` with the demo's
prefilters for that source (fastText language ID, Gopher quality and repetition rules), as the
`prefiltered` asset runs it.

1. Memory. The stage runs in a fresh process, in-process (`workers=0`, the same shard work a Ray worker
   does), once on the source and once on the source repeated `--copies` times; the peak RSS of each
   process is compared. Streaming by shard and batch keeps it flat: goal within 1.3x at 4x the data.
2. Throughput. On a local Ray with every core, the stage runs on the same input (`--throughput-copies`
   repeats) with 1 worker, then with one worker per core, from an empty output each time; documents per
   second of each, wall clock including the actor pool's start. Goal: 1.7x on 2 cores.

Baseline: `1_worker`, the same stage on one Ray worker, run side by side in this script.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard

from benchmarks._smoke import parse_with_smoke
from moe_dag.curation.demo_corpus import DemoCorpusConfig, build_demo_corpus
from moe_dag.curation.filters import PrefilterConfig, build_prefilters
from moe_dag.curation.ingest import ingest_source
from moe_dag.curation.work import FilterWork
from moe_dag.engine import RayConfig, StageSpec, connect, run_stage, upstream_inputs
from moe_dag.storage.lake import Lake

SOURCE = "prose"


def prefilter_spec() -> StageSpec:
    config = PrefilterConfig()
    make_filters = functools.partial(build_prefilters, config, "reference", ["en"])
    return StageSpec(
        outputs=("prefiltered",),
        make_work=functools.partial(FilterWork, "prefiltered", make_filters),
        params=repr(config),
        warm=True,
    )


def repeated_source(corpus: Path, out: Path, copies: int) -> Path:
    """The source's shards `copies` times, each copy with its own ids (`<id>~<copy>`)."""
    out.mkdir(parents=True, exist_ok=True)
    for shard in sorted((corpus / SOURCE).glob("*.jsonl.*")):
        lines = _decompressed(shard).decode().splitlines()
        for copy in range(copies):
            records = []
            for line in lines:
                try:
                    record = json.loads(line)
                    record["id"] = f"{record['id']}~{copy}"
                    records.append(json.dumps(record))
                except (json.JSONDecodeError, KeyError):
                    records.append(line)  # the corpus's planted bad lines stay bad
            (out / f"{shard.name.split('.')[0]}-copy{copy}.jsonl").write_text("\n".join(records) + "\n")
    return out


def _decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def lake_with(work: Path, corpus: Path, copies: int) -> Lake:
    lake = Lake(work / f"lake-{copies}x")
    ingest_source(lake, SOURCE, str(repeated_source(corpus, work / f"shards-{copies}x", copies)), workers=0)
    return lake


MEASURE_RSS = """
import resource, sys
sys.path.insert(0, {root!r})
from benchmarks.data_plane import SOURCE, prefilter_spec
from moe_dag.engine import run_stage, upstream_inputs
from moe_dag.storage.lake import Lake
lake = Lake({lake!r})
run = run_stage(prefilter_spec(), lake, SOURCE, upstream_inputs(lake, "raw_documents", SOURCE), workers=0)
print(run.counts["documents"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_mib(lake: Lake) -> tuple[int, float]:
    script = MEASURE_RSS.format(root=str(Path(__file__).resolve().parent.parent), lake=lake.url)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    documents, kib = out.split()[-2:]
    return int(documents), int(kib) / 1024


def docs_per_second(lake: Lake, workers: int) -> float:
    shutil.rmtree(lake.dataset_dir("prefiltered", SOURCE), ignore_errors=True)
    started = time.perf_counter()
    run = run_stage(
        prefilter_spec(), lake, SOURCE, upstream_inputs(lake, "raw_documents", SOURCE), workers=workers
    )
    return run.counts["documents"] / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-source", type=int, default=1000)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--throughput-copies", type=int, default=8)
    args = parse_with_smoke(parser, {"docs_per_source": 60, "copies": 2, "throughput_copies": 2})

    with tempfile.TemporaryDirectory(prefix="data-plane-") as folder:
        work = Path(folder)
        build_demo_corpus(work / "corpus", DemoCorpusConfig(docs_per_source=args.docs_per_source, seed=0))
        small, large = lake_with(work, work / "corpus", 1), lake_with(work, work / "corpus", args.copies)
        docs_1x, rss_1x = peak_rss_mib(small)
        docs_nx, rss_nx = peak_rss_mib(large)
        print(
            f"peak RSS of the stage: {rss_1x:.0f} MiB on {docs_1x} documents, {rss_nx:.0f} MiB on {docs_nx}"
        )

        cores = os.cpu_count() or 1
        print(connect(RayConfig(num_cpus=cores)))
        lake = (
            large
            if args.throughput_copies == args.copies
            else lake_with(work, work / "corpus", args.throughput_copies)
        )
        one = docs_per_second(lake, workers=1)
        every = docs_per_second(lake, workers=cores)
        print(f"prefilter on Ray: {one:.0f} docs/s with 1 worker, {every:.0f} docs/s with {cores} workers")

    print(
        json.dumps(
            {
                "bench": "data_plane",
                "baseline": "1_worker",
                "documents": docs_nx,
                "rss_1x_mib": round(rss_1x, 1),
                "rss_4x_mib": round(rss_nx, 1),
                "rss_ratio_4x": round(rss_nx / rss_1x, 3),
                "workers": cores,
                "docs_per_s_1_worker": round(one, 1),
                "docs_per_s_all_workers": round(every, 1),
                "speedup": round(every / one, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
