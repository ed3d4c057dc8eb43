"""Language ID: fastText lid.176 (moe-dag's choice) against langid.py (the offline alternative), one run.

Both identify the same labelled samples of real translated text (`labelled_language_samples`: gettext
messages from the catalogues installed on the machine, 20 samples of ~200 characters per language). The
figures: documents per second per core (CPU time, single thread, best of `--repeats`), accuracy overall
and per language for each, and how often the two agree. Needs the `bench` extra (langid).

    .venv/bin/python benchmarks/language_id.py [--repeats 3]

Prints a table, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from moe_dag.data.filters.language import LanguageFilter  # noqa: E402
from moe_dag.data.filters.reference import labelled_language_samples  # noqa: E402

# langid.py names Norwegian Bokmål "nb"; the samples (and lid.176) say "no".
_LANGID_LABELS = {"nb": "no"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import langid

    samples = labelled_language_samples()
    texts = [text for group in samples.values() for text in group]
    labels = [label for label, group in samples.items() for _ in group]
    fasttext = LanguageFilter(languages=[], min_score=0.0)
    identifier = langid.langid.LanguageIdentifier.from_modelstring(langid.langid.model, norm_probs=False)

    def ours() -> list[str]:
        return list(fasttext.score(texts)["language"])

    def theirs() -> list[str]:
        return [_LANGID_LABELS.get(code, code) for code, _ in map(identifier.classify, texts)]

    ours(), theirs()  # load both models before timing
    timings: dict[str, list[float]] = {"fasttext": [], "langid": []}
    for _ in range(args.repeats):
        for name, run in (("fasttext", ours), ("langid", theirs)):
            start = time.process_time()
            found = run()
            timings[name].append(time.process_time() - start)
            if name == "fasttext":
                ours_found = found
            else:
                theirs_found = found

    def accuracy(found: list[str], language: str | None = None) -> float:
        pairs = [(f, label) for f, label in zip(found, labels, strict=True) if language in (None, label)]
        return round(sum(f == label for f, label in pairs) / len(pairs), 3)

    by_language = {
        language: {"fasttext": accuracy(ours_found, language), "langid": accuracy(theirs_found, language)}
        for language in samples
    }
    print(f"{len(texts)} samples in {len(samples)} languages")
    print("language  lid.176  langid")
    for language, figures in by_language.items():
        print(f"{language:8s}  {figures['fasttext']:7.2f}  {figures['langid']:6.2f}")
    ours_rate = len(texts) / min(timings["fasttext"])
    theirs_rate = len(texts) / min(timings["langid"])
    print(f"accuracy: lid.176 {accuracy(ours_found):.3f}, langid {accuracy(theirs_found):.3f}")
    ratio = ours_rate / theirs_rate
    print(f"docs/s per core: lid.176 {ours_rate:.0f}, langid {theirs_rate:.0f}, ratio {ratio:.1f}x")
    print(
        json.dumps(
            {
                "bench": "language_id",
                "baseline": "langid.py 1.1.6",
                "documents": len(texts),
                "languages": len(samples),
                "docs_per_s_core": round(ours_rate, 1),
                "langid_docs_per_s_core": round(theirs_rate, 1),
                "ratio": round(ratio, 2),
                "accuracy": accuracy(ours_found),
                "langid_accuracy": accuracy(theirs_found),
                "agreement": round(
                    sum(a == b for a, b in zip(ours_found, theirs_found, strict=True)) / len(texts), 4
                ),
                "accuracy_by_language": by_language,
            }
        )
    )


if __name__ == "__main__":
    main()
