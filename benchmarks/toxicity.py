"""Toxicity: moe-dag's classifier filter (alt-profanity-check, per line) against better-profanity (word list).

The documents: every real document `installed_documents` finds (READMEs, help topics, docstrings),
labelled clean, and as many copies of them with two or three of the demo corpus's insults inserted
between lines (`moe_dag.data.demo_corpus.noise.toxic_text`), labelled toxic. The toxic half is synthetic
and the clean half is assumed clean: the figures compare the two tools on one set, they are not a
calibration (README: the defaults come from labelled real tweets). Figures: documents per second per
core (CPU time, single thread, best of `--repeats`), precision and recall of each, their agreement.
better-profanity reads about 4 kB of text per CPU second, hence the small default `--limit`.

    .venv/bin/python benchmarks/toxicity.py [--limit N] [--repeats 2]

Prints human-readable lines, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

import pyarrow as pa  # noqa: E402

from moe_dag.data.demo_corpus.noise import toxic_text  # noqa: E402
from moe_dag.data.filters import ToxicityConfig, build_toxicity_filters, run_filters  # noqa: E402
from moe_dag.data.filters.reference import installed_documents  # noqa: E402


def precision_recall(predicted: list[bool], labels: list[bool]) -> tuple[float, float]:
    true_positive = sum(p and t for p, t in zip(predicted, labels, strict=True))
    return true_positive / max(sum(predicted), 1), true_positive / max(sum(labels), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=60, help="clean documents to use (0: all)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from better_profanity import profanity

    clean = installed_documents()
    if args.limit:
        clean = clean[: args.limit]
    rng = random.Random(0)
    texts = clean + [toxic_text(rng, text, "prose") for text in clean]
    labels = [False] * len(clean) + [True] * len(clean)
    filters = build_toxicity_filters(ToxicityConfig(), "web")
    profanity.load_censor_words()

    def ours() -> list[bool]:
        return [not keep for keep in run_filters(pa.table({"text": texts}), filters)[0]["keep"].to_pylist()]

    def theirs() -> list[bool]:
        return [profanity.contains_profanity(text) for text in texts]

    timings: dict[str, list[float]] = {"moe_dag": [], "better_profanity": []}
    found: dict[str, list[bool]] = {}
    for _ in range(args.repeats):
        for name, run in (("moe_dag", ours), ("better_profanity", theirs)):
            start = time.process_time()
            found[name] = run()
            timings[name].append(time.process_time() - start)

    ours_rate = len(texts) / min(timings["moe_dag"])
    theirs_rate = len(texts) / min(timings["better_profanity"])
    ours_pr, theirs_pr = (
        precision_recall(found["moe_dag"], labels),
        precision_recall(found["better_profanity"], labels),
    )
    agreement = sum(map(bool.__eq__, found["moe_dag"], found["better_profanity"])) / len(texts)
    print(f"{len(texts)} documents ({len(clean)} clean, {len(clean)} with insults inserted)")
    for name, (precision, recall), rate in (
        ("moe-dag", ours_pr, ours_rate),
        ("better-profanity", theirs_pr, theirs_rate),
    ):
        print(f"{name:17s} precision {precision:.3f} recall {recall:.3f}  {rate:.0f} docs/s per core")
    print(
        json.dumps(
            {
                "bench": "toxicity",
                "baseline": "better-profanity 0.7 contains_profanity",
                "documents": len(texts),
                "docs_per_s_core": round(ours_rate, 1),
                "better_profanity_docs_per_s_core": round(theirs_rate, 1),
                "ratio": round(ours_rate / theirs_rate, 2),
                "precision": round(ours_pr[0], 4),
                "recall": round(ours_pr[1], 4),
                "better_profanity_precision": round(theirs_pr[0], 4),
                "better_profanity_recall": round(theirs_pr[1], 4),
                "agreement": round(agreement, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
