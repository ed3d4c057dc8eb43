"""Toxicity: moe-dag's classifier filter (alt-profanity-check, per line) against better-profanity (word list),
and the document-level defaults (`max_toxic_share`, `single_line_probability`) against the former rule.

The labelled documents, all built from real text found on the machine (`installed_documents`: READMEs,
help topics, docstrings of more than 60 words, up to `--documents`):
- clean: each document as found. Labelled clean by assumption; the lines the classifier scores above 0.8
  were read by hand (issue 20): a name list ("Dick Marinus, ...", 0.96), a shell line (0.82), and the
  READMEs of the profanity libraries, which quote profanity as examples (1.0);
- clean, odd heading: each document under one of the headings of issue 20 ("Rear naked choke", "Petals
  on a wet, black bough.", "Prelude canyon battle"), clean;
- toxic: each document with two or three of the demo corpus's insults inserted between its lines
  (`moe_dag.curation.demo_corpus.noise.toxic_text`). Synthetic, and easy: every insult scores 0.99 or more.
No labelled set of real toxic documents installs here, so recall is measured on the inserted insults
only; the clean side is real. Figures: precision and recall of the defaults and of the former rule (any
line above 0.5 drops), false drops per clean set, the (share, bar) grid the defaults were chosen from,
documents per second per core (CPU time, single thread, best of `--repeats`) against better-profanity on
the first `--limit` clean documents and their toxic copies (it reads about 4 kB of text per CPU second).

    .venv/bin/python -m benchmarks.toxicity [--documents 1000] [--limit N] [--repeats 2]

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

from benchmarks._smoke import parse_with_smoke  # noqa: E402
from moe_dag.curation.demo_corpus.noise import toxic_text  # noqa: E402
from moe_dag.curation.filters import ToxicityConfig, build_toxicity_filters, run_filters  # noqa: E402
from moe_dag.curation.filters.reference import installed_documents  # noqa: E402


def precision_recall(predicted: list[bool], labels: list[bool]) -> tuple[float, float]:
    true_positive = sum(p and t for p, t in zip(predicted, labels, strict=True))
    return true_positive / max(sum(predicted), 1), true_positive / max(sum(labels), 1)


ODD_HEADINGS = ("Rear naked choke", "Petals on a wet, black bough.", "Prelude canyon battle")
FORMER_RULE = ToxicityConfig(max_toxic_share=0.0)  # one line above the 0.5 cut dropped any document
SHARES = (0.0, 0.02, 0.05, 0.1, 0.2)
BARS = (0.9, 0.95, 0.98, 0.99)


def dropped(texts: list[str], config: ToxicityConfig) -> list[bool]:
    filters = build_toxicity_filters(config, "web")
    return [not keep for keep in run_filters(pa.table({"text": texts}), filters)[0]["keep"].to_pylist()]


def document_rules(documents: int) -> dict:
    """Precision, recall and false drops of the defaults and the former rule on the labelled sets, and the
    grid of (max_toxic_share, single_line_probability) the defaults were chosen from (the classifier
    alone: the word list is the same second signal under every rule)."""
    clean = [text for text in installed_documents() if len(text.split()) > 60][:documents]
    rng = random.Random(0)
    headed = [f"{ODD_HEADINGS[i % 3]}\n{text}" for i, text in enumerate(clean)]
    toxic = [toxic_text(rng, text, "prose") for text in clean]
    texts, labels = clean + headed + toxic, [False] * 2 * len(clean) + [True] * len(clean)
    figures: dict = {"documents": {"clean": len(clean), "odd_heading": len(headed), "toxic": len(toxic)}}
    configs = {"defaults": ToxicityConfig(), "former_rule": FORMER_RULE}
    configs |= {
        f"share_{share}_bar_{bar}": ToxicityConfig(max_toxic_share=share, single_line_probability=bar)
        for share in SHARES
        for bar in BARS
    }
    # Every configuration here shares the line cut, so the lines are scored once and only decided again.
    scores = build_toxicity_filters(ToxicityConfig(), "web")[0].score(texts)
    rows = [{name: column[i] for name, column in scores.items()} for i in range(len(texts))]
    for name, config in configs.items():
        classifier = build_toxicity_filters(config, "web")[0]
        found = [classifier.decide(text, row) is not None for text, row in zip(texts, rows, strict=True)]
        precision, recall = precision_recall(found, labels)
        n = len(clean)
        figures[name] = {
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "clean_dropped": sum(found[:n]),
            "odd_heading_dropped": sum(found[n : 2 * n]),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1000, help="real documents for the labelled sets")
    parser.add_argument("--limit", type=int, default=60, help="clean documents for the speed comparison")
    parser.add_argument("--repeats", type=int, default=2)
    args = parse_with_smoke(parser, {"documents": 30, "limit": 3, "repeats": 1})

    from better_profanity import profanity

    rules = document_rules(args.documents)
    print(f"labelled sets: {rules['documents']}", flush=True)
    for name in ("defaults", "former_rule", *(k for k in rules if k.startswith("share_"))):
        print(f"{name:28s} {rules[name]}", flush=True)
    clean = installed_documents()
    if args.limit:
        clean = clean[: args.limit]
    rng = random.Random(0)
    texts = clean + [toxic_text(rng, text, "prose") for text in clean]
    labels = [False] * len(clean) + [True] * len(clean)
    profanity.load_censor_words()

    def ours() -> list[bool]:
        return dropped(texts, ToxicityConfig())

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
    print(f"speed: {len(texts)} documents ({len(clean)} clean, {len(clean)} with insults inserted)")
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
                "labelled_documents": rules["documents"],
                "defaults": rules["defaults"],
                "former_rule": rules["former_rule"],
            }
        )
    )


if __name__ == "__main__":
    main()
