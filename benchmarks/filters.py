"""moe-dag's four rule families against datatrove's filters, on the same real documents in one run.

Both sides run with the references' default settings (`PrefilterConfig.reference()` and datatrove's
constructors) on every document installed with Python and its packages that
`moe_dag.curation.filters.reference.installed_documents` finds (READMEs, README pieces, help topics, standard
library docstrings). Each side evaluates all four families on every document (datatrove's word splitting
is shared across its filters by its own cache, as in a datatrove pipeline; moe-dag's by its chunk cache),
so both do the same work and every family's decision is known for every document.

Figures: documents per second per core (CPU time of this single-threaded process, best of `--repeats`
alternating runs), their ratio, and agreement of the keep decisions overall (all four families keep)
and per family. Needs the `bench` extra.

    .venv/bin/python -m benchmarks.filters [--limit N] [--repeats 2]

Prints human-readable lines, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per side: set before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import pyarrow as pa  # noqa: E402

from benchmarks._smoke import parse_with_smoke  # noqa: E402
from moe_dag.curation.filters import PrefilterConfig, run_filters  # noqa: E402
from moe_dag.curation.filters.prefilter import FAMILIES  # noqa: E402
from moe_dag.curation.filters.reference import datatrove_filters, datatrove_keep, installed_documents  # noqa: E402


def moe_dag_decisions(texts: list[str]) -> dict[str, list[bool]]:
    config = PrefilterConfig.reference()
    table = pa.table({"text": texts})
    return {
        family: run_filters(table, [config.family_filter(family)])[0]["keep"].to_pylist()
        for family in FAMILIES
    }


def datatrove_decisions(texts: list[str]) -> dict[str, list[bool]]:
    filters = datatrove_filters()
    decisions: dict[str, list[bool]] = {family: [] for family in FAMILIES}
    for text in texts:
        for family in FAMILIES:
            decisions[family].append(datatrove_keep(filters[family], text)[0])
    return decisions


def timed(run, texts: list[str]) -> tuple[dict[str, list[bool]], float]:
    start = time.process_time()
    decisions = run(texts)
    return decisions, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="use only the first N documents (0: all)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parse_with_smoke(parser, {"limit": 40, "repeats": 1})

    texts = installed_documents()
    if args.limit:
        texts = texts[: args.limit]
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} M characters")
    ours_seconds, theirs_seconds = [], []
    for repeat in range(args.repeats):
        ours, seconds = timed(moe_dag_decisions, texts)
        ours_seconds.append(seconds)
        theirs, seconds = timed(datatrove_decisions, texts)
        theirs_seconds.append(seconds)
        print(
            f"run {repeat + 1}: moe-dag {ours_seconds[-1]:.2f} s, datatrove {theirs_seconds[-1]:.2f} s (CPU)"
        )

    by_family = {
        family: round(sum(a == b for a, b in zip(ours[family], theirs[family], strict=True)) / len(texts), 4)
        for family in FAMILIES
    }
    overall_ours = [all(ours[f][i] for f in FAMILIES) for i in range(len(texts))]
    overall_theirs = [all(theirs[f][i] for f in FAMILIES) for i in range(len(texts))]
    agreement = sum(a == b for a, b in zip(overall_ours, overall_theirs, strict=True)) / len(texts)
    ours_rate, theirs_rate = len(texts) / min(ours_seconds), len(texts) / min(theirs_seconds)
    for family in FAMILIES:
        print(
            f"{family:18s} keeps: moe-dag {sum(ours[family]):5d}  datatrove {sum(theirs[family]):5d}  "
            f"agreement {by_family[family]:.4f}"
        )
    print(f"all four keep:     moe-dag {sum(overall_ours):5d}  datatrove {sum(overall_theirs):5d}")
    print(
        f"docs/s per core: moe-dag {ours_rate:.1f}, datatrove {theirs_rate:.1f}, "
        f"ratio {ours_rate / theirs_rate:.1f}x"
    )
    print(
        json.dumps(
            {
                "bench": "filters",
                "baseline": "datatrove 0.10 GopherRepetition, GopherQuality, C4Quality, FineWebQuality",
                "documents": len(texts),
                "docs_per_s_core": round(ours_rate, 1),
                "datatrove_docs_per_s_core": round(theirs_rate, 1),
                "ratio": round(ours_rate / theirs_rate, 2),
                "agreement": round(agreement, 4),
                "agreement_by_family": by_family,
            }
        )
    )


if __name__ == "__main__":
    main()
