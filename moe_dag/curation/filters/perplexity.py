"""Perplexity outliers: a small n-gram language model scores each document; each source drops its tails.

CCNet (Wenzek et al. 2019, arXiv:1911.00359) scores web text with a KenLM 5-gram trained on Wikipedia and
keeps documents by perplexity percentiles of their own language. Here the reference is, by default, a
clean subset of the source itself: a seeded sample of the documents the rule families kept. Too low a
perplexity is boilerplate (repeated navigation, legal text, lists of keywords); too high is garbage
(mangled encoding, tables of numbers, another language). The cut is given as percentiles of the source's
own distribution, so one setting fits sources of very different styles.

Why not KenLM: on PyPI `kenlm` is only the query module, built from source, without `lmplz` (the trainer),
and the model must be trained in process on each source's reference set. The model here is a word n-gram
(order 3 by default) with interpolated absolute discounting (Ney, Essen & Kneser 1994; KenLM's default is
its modified Kneser-Ney refinement): P(w | u) = max(c(u w) - D, 0) / c(u) + D N1+(u .) / c(u) P(w | u'),
with u' the context without its first word, down to a unigram smoothed over the vocabulary and one
unknown-word type. Counting and scoring are numpy over integer n-gram keys (sort, unique, searchsorted):
no Python loop per token.

Words are runs of letters, digits and combining marks (Indic vowel signs are marks, which `\\w` leaves
out), and in scripts written without spaces (Chinese, Japanese, Thai) each letter is a token: otherwise a
Chinese clause is one unknown "word", and the fixture's Chinese documents scored a median perplexity of
4e16 against English's 84.

A multilingual source is cut per language. One model of the whole source still scores the languages on
scales that differ by orders of magnitude, in location and in spread (on the parallel fixture of
tests/fixtures/multilingual the median log10 perplexity is 1.0 in Chinese, 2.0 in English and 11.9 in
Telugu, whose words the model mostly spells out; the 10-90% range is 0.6 decades in Chinese and 6.8 in
Telugu), so a cut over the pooled scores takes its tails from the outlying languages. Each language's log
perplexities are first moved to the source's median and median absolute deviation, the percentiles are
taken over those pooled, and each language's cut is that cut moved back to its own median and spread. The
tails' shape is the source's, since a 1% tail cannot be read from the 15 documents a small language may
have; location and width are the language's own. A language with fewer than `min_language_documents`
documents, or a document without a language, is judged by the source-wide cut. A source in one language
gets exactly the cut over its own scores.

`PerplexityFilter` needs the source's whole distribution before it can cut, so it is a whole-table filter
(`run_filters` gives it every row still kept at once). Fitted once (`fit`), it is a plain per-document
filter and pickles small, so a Ray actor can build it from a fitted copy; it is stored in the lake as data
(`state`: JSON values and named arrays), never pickled there.
"""

from __future__ import annotations

import math
import random
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.text import _UNSPACED_LETTER


def _combining_marks() -> str:
    """A regex character class body of every combining mark (Unicode category M), as ranges. Past the
    multilingual and supplementary planes only the variation selectors (U+E0100-E01EF) are marks."""
    candidates = [*range(0x1F000), *range(0xE0100, 0xE01F0)]
    marks = [c for c in candidates if unicodedata.category(chr(c)).startswith("M")]
    ranges, start = [], marks[0]
    for previous, current in zip(marks, [*marks[1:], None], strict=True):
        if current != previous + 1:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(previous))}")
            start = current
    return "".join(ranges)


_MARKS = _combining_marks()
# A word is a run of letters, digits and the combining marks that spell Indic and other scripts' vowels
# (which `\w` leaves out, splitting a Hindi word into fragments and marks); in a script written without
# spaces (Chinese, Japanese, Thai) each letter is a token, as a whole clause would be one unknown "word".
_TOKEN = re.compile(
    f"{_UNSPACED_LETTER.pattern}|(?:(?!{_UNSPACED_LETTER.pattern})[\\w{_MARKS}])+|[^\\w\\s{_MARKS}]"
)
_START, _UNKNOWN = 0, 1  # reserved word ids
# The model's per-order arrays, as `state` names them.
_MODEL_ARRAYS = ("keys", "counts", "context_keys", "context_counts", "context_types")


@dataclass
class NgramLanguageModel:
    """A word n-gram model with interpolated absolute discounting, fitted on reference texts."""

    order: int
    vocabulary: dict[str, int]
    keys: list[np.ndarray]  # per order: sorted n-gram keys
    counts: list[np.ndarray]  # per order: their counts
    context_keys: list[np.ndarray]  # per order >= 2: sorted context keys
    context_counts: list[np.ndarray]
    context_types: list[np.ndarray]  # distinct words seen after each context
    char_log_probabilities: dict[str, float]  # spelling model for unknown words, "" is the word's end
    discount: float = 0.75

    @classmethod
    def fit(
        cls, texts: list[str], *, order: int = 3, min_count: int = 2, discount: float = 0.75
    ) -> NgramLanguageModel:
        if order < 1:
            raise ValueError(f"NgramLanguageModel: order must be >= 1, got {order}")
        frequency: dict[str, int] = {}
        tokenised = [_words(text) for text in texts]
        for words in tokenised:
            for word in words:
                frequency[word] = frequency.get(word, 0) + 1
        vocabulary = {
            word: i + 2 for i, word in enumerate(sorted(w for w, c in frequency.items() if c >= min_count))
        }
        size = len(vocabulary) + 2
        if size**order >= 2**62:
            raise ValueError(
                f"NgramLanguageModel: a vocabulary of {size} words is too large for order {order}"
            )
        ids = [_ids(words, vocabulary, order) for words in tokenised]
        model = cls(order, vocabulary, [], [], [], [], [], _spelling_model(frequency), discount)
        for n in range(1, order + 1):
            # Only n-grams ending on a real word: the start symbols are context, never predicted.
            grams = [_ngram_keys(doc, n, size)[order - n :] for doc in ids]
            keys = np.concatenate(grams) if grams else np.zeros(0, np.int64)
            unique, counts = np.unique(keys, return_counts=True)
            model.keys.append(unique)
            model.counts.append(counts)
            if n >= 2:
                contexts = unique // size
                context_unique, start = np.unique(contexts, return_index=True)
                model.context_keys.append(context_unique)
                model.context_counts.append(np.add.reduceat(counts, start) if len(counts) else counts)
                model.context_types.append(np.diff(np.append(start, len(contexts))))
        return model

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The model as JSON-serialisable values and named arrays (`from_state` reads them back)."""
        values = {
            "order": self.order,
            "vocabulary": self.vocabulary,
            "char_log_probabilities": self.char_log_probabilities,
            "discount": self.discount,
        }
        arrays = {
            f"{field}.{n}": array for field in _MODEL_ARRAYS for n, array in enumerate(getattr(self, field))
        }
        return values, arrays

    @classmethod
    def from_state(cls, values: dict[str, Any], arrays: dict[str, np.ndarray]) -> NgramLanguageModel:
        order = int(values["order"])
        listed = {
            field: [
                arrays[f"{field}.{n}"] for n in range(order if field in ("keys", "counts") else order - 1)
            ]
            for field in _MODEL_ARRAYS
        }
        return cls(
            order,
            {str(word): int(i) for word, i in values["vocabulary"].items()},
            char_log_probabilities={str(ch): float(p) for ch, p in values["char_log_probabilities"].items()},
            discount=float(values["discount"]),
            **listed,
        )

    def perplexity(self, text: str) -> float:
        """exp of the mean negative log-probability of the text's words (nan for a text without words)."""
        words = _words(text)
        if not words:
            return float("nan")
        ids = _ids(words, self.vocabulary, self.order)
        log_probabilities = self._log_probabilities(ids)
        # An unknown word is the unknown type, then spelt out: garbage words are each unlikely, not one
        # frequent "<unk>" (which would make a page of mangled text look fluent).
        unknown_floor = self.char_log_probabilities[""]
        for i, word in enumerate(words):
            if ids[self.order - 1 + i] == _UNKNOWN:
                log_probabilities[i] += unknown_floor + sum(
                    self.char_log_probabilities.get(ch, self.char_log_probabilities["\0"]) for ch in word
                )
        return math.exp(-float(np.mean(log_probabilities)))

    def _log_probabilities(self, ids: np.ndarray) -> np.ndarray:
        size = len(self.vocabulary) + 2
        words = ids[self.order - 1 :]
        # Unigram: counts smoothed with add-one over the vocabulary and the unknown type (not the start).
        total = float(self.counts[0].sum()) if len(self.counts[0]) else 0.0
        probability = (_lookup(self.keys[0], self.counts[0], words) + 1.0) / (total + size - 1)
        for n in range(2, self.order + 1):
            grams = _ngram_keys(ids, n, size)[self.order - n :]
            contexts = grams // size
            c_context = _lookup(self.context_keys[n - 2], self.context_counts[n - 2], contexts)
            types = _lookup(self.context_keys[n - 2], self.context_types[n - 2], contexts)
            c_gram = _lookup(self.keys[n - 1], self.counts[n - 1], grams)
            seen = c_context > 0
            safe = np.where(seen, c_context, 1.0)
            interpolated = (
                np.maximum(c_gram - self.discount, 0.0) / safe + self.discount * types / safe * probability
            )
            probability = np.where(seen, interpolated, probability)
        return np.log(probability)


def _log_location_and_spread(perplexities: np.ndarray) -> tuple[float, float]:
    """Median and median absolute deviation of log perplexity: robust on the few documents of a language."""
    if not len(perplexities):
        return (0.0, 0.0)
    logs = np.log(perplexities)
    median = float(np.median(logs))
    return (median, float(np.median(np.abs(logs - median))))


def _rescale(
    perplexities: np.ndarray, source: tuple[float, float], target: tuple[float, float]
) -> np.ndarray:
    """Perplexities moved from one (log median, log spread) to another, keeping their standard score."""
    return np.exp(target[0] + (np.log(perplexities) - source[0]) * (target[1] / source[1]))


def _spelling_model(frequency: dict[str, int]) -> dict[str, float]:
    """Character log-probabilities of the words seen once (the best guide to unseen words), add-one
    smoothed, with "" for the end of a word and "\\0" for any character never seen."""
    characters: dict[str, int] = {}
    ends = 0
    for word, count in frequency.items():
        if count == 1:
            ends += 1
            for ch in word:
                characters[ch] = characters.get(ch, 0) + 1
    total = sum(characters.values()) + ends + len(characters) + 2
    model = {ch: math.log((c + 1) / total) for ch, c in characters.items()}
    model[""] = math.log((ends + 1) / total)
    model["\0"] = math.log(1 / total)
    return model


def _words(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _ids(words: list[str], vocabulary: dict[str, int], order: int) -> np.ndarray:
    """Word ids with `order - 1` start symbols in front."""
    body = np.fromiter((vocabulary.get(w, _UNKNOWN) for w in words), np.int64, len(words))
    return np.concatenate([np.full(order - 1, _START, np.int64), body])


def _ngram_keys(ids: np.ndarray, n: int, size: int) -> np.ndarray:
    """One integer per n-gram (its ids as digits in base `size`), len(ids) - n + 1 of them."""
    if len(ids) < n:
        return np.zeros(0, np.int64)
    keys = ids[: len(ids) - n + 1].copy()
    for k in range(1, n):
        keys = keys * size + ids[k : len(ids) - n + 1 + k]
    return keys


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[keys == query] for each query, 0 where the key is absent."""
    if len(keys) == 0:
        return np.zeros(len(queries))
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[at] == queries, values[at], 0).astype(np.float64)


@dataclass(kw_only=True)
class PerplexityConfig:
    """Documents under the low or over the high percentile of the source's perplexity drop. The model
    trains on `reference` (a .parquet or .jsonl file with a `text` column), else on a sample of the
    documents the rules kept; the cuts are percentiles over the first `sample_documents` of the source,
    fitted once before the source fans out over workers."""

    low_percentile: float = 1.0
    high_percentile: float = 99.0
    order: int = 3
    reference: str | None = None
    reference_documents: int = 2000
    min_documents: int = 100
    # Documents of one language (from language ID) it needs to place its cut at its own median.
    min_language_documents: int = 5
    sample_documents: int = 100_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_percentile < self.high_percentile <= 100.0:
            raise ValueError("perplexity: need 0 <= low_percentile < high_percentile <= 100")
        if self.min_language_documents < 1:
            raise ValueError("perplexity: min_language_documents must be >= 1")


# The field of `PerplexityConfig` that governs each reason.
REASON_SETTINGS: dict[str, str | None] = {
    "perplexity_too_low": "low_percentile",
    "perplexity_too_high": "high_percentile",
}


# The constructor's arguments, which a stored fit keeps beside the fitted state.
_FILTER_SETTINGS = (
    "low_percentile",
    "high_percentile",
    "order",
    "reference_documents",
    "min_documents",
    "min_language_documents",
    "reference_texts",
    "seed",
)


class PerplexityFilter(DocumentFilter):
    """Drop documents whose perplexity lies below or above the given percentiles of the source's, each
    language judged about its own median."""

    name = "perplexity"
    reasons = ("perplexity_too_low", "perplexity_too_high")
    inputs = ("language",)
    whole_table = True

    def __init__(
        self,
        *,
        low_percentile: float,
        high_percentile: float,
        order: int = 3,
        reference_documents: int = 2000,
        min_documents: int = 100,
        min_language_documents: int = 5,
        reference_texts: list[str] | None = None,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= low_percentile < high_percentile <= 100.0:
            raise ValueError(
                f"PerplexityFilter: need 0 <= low_percentile < high_percentile <= 100, "
                f"got {low_percentile}, {high_percentile}"
            )
        self.low_percentile = low_percentile
        self.high_percentile = high_percentile
        self.order = order
        self.reference_documents = reference_documents
        self.min_documents = min_documents
        self.min_language_documents = min_language_documents
        self.reference_texts = reference_texts
        self.seed = seed
        self.model: NgramLanguageModel | None = None
        # The source-wide cut, and the cut of each language with its own median (JSON-serialisable).
        self.cuts: tuple[float, float] | None = None
        self.language_cuts: dict[str, tuple[float, float]] = {}

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The filter's settings and fitted cuts as JSON-serialisable values, and its model's arrays: what
        a stored fit holds (`moe_dag.curation.fits`), read back by `from_state`."""
        model, arrays = self.model.state() if self.model is not None else (None, {})
        values = {
            "settings": {name: getattr(self, name) for name in _FILTER_SETTINGS},
            "cuts": list(self.cuts) if self.cuts is not None else None,
            "language_cuts": {language: list(cut) for language, cut in self.language_cuts.items()},
            "model": model,
        }
        return values, arrays

    @classmethod
    def from_state(cls, values: dict[str, Any], arrays: dict[str, np.ndarray]) -> PerplexityFilter:
        restored = cls(**{name: values["settings"][name] for name in _FILTER_SETTINGS})
        cuts = values["cuts"]
        restored.cuts = (float(cuts[0]), float(cuts[1])) if cuts is not None else None
        restored.language_cuts = {
            str(language): (float(low), float(high))
            for language, (low, high) in values["language_cuts"].items()
        }
        if values["model"] is not None:
            restored.model = NgramLanguageModel.from_state(values["model"], arrays)
        return restored

    def fit(self, texts: list[str], **inputs: list[Any]) -> PerplexityFilter:
        """Train the model (on `reference_texts`, else a sample of `texts`) and set the cuts from `texts`,
        per language where `inputs["language"]` gives each text's language.

        With fewer than `min_documents` texts there is no distribution to cut: every document is kept.
        The three steps are also callable apart (`reference_rows`, `fit_model`, `fit_cuts`), so the fit can
        run where the texts are (`moe_dag.curation.fits.fit_source_in_tasks`) with the same result.
        """
        self.language_cuts = {}
        if len(texts) < self.min_documents:
            self.cuts = (-math.inf, math.inf)
            return self
        rows = self.reference_rows(len(texts))
        self.fit_model(self.reference_texts if rows is None else [texts[i] for i in rows])
        assert self.model is not None
        scores = np.array([self.model.perplexity(text) for text in texts])
        return self.fit_cuts(scores, inputs.get("language"))

    def reference_rows(self, documents: int) -> list[int] | None:
        """Which of the `documents` texts the model trains on, in order (None: the fixed reference texts)."""
        if self.reference_texts is not None:
            return None
        return random.Random(self.seed).sample(range(documents), min(self.reference_documents, documents))

    def fit_model(self, reference: list[str]) -> None:
        self.model = NgramLanguageModel.fit(reference, order=self.order)

    def fit_cuts(self, scores: np.ndarray, languages: list[str | None] | None) -> PerplexityFilter:
        """The cuts from the model's perplexity of each text the filter was fitted on, and their languages."""
        known = ~np.isnan(scores)
        languages = np.array(languages or [None] * len(scores), dtype=object)[known]
        scores = scores[known]
        source = _log_location_and_spread(scores)
        own = {}
        for language in sorted({lang for lang in languages.tolist() if lang is not None}):
            if (languages == language).sum() >= self.min_language_documents:
                located = _log_location_and_spread(scores[languages == language])
                if located[1] > 0 and source[1] > 0 and located != source:
                    own[language] = located
        # Each language's scores on the source's scale; a one-language source keeps its raw scores.
        pooled = scores.copy()
        for language, located in own.items():
            rows = languages == language
            pooled[rows] = _rescale(scores[rows], located, source)
        low, high = (
            np.percentile(pooled, [self.low_percentile, self.high_percentile]) if len(scores) else (0, 0)
        )
        self.cuts = (
            float(low) if self.low_percentile > 0 else -math.inf,
            float(high) if self.high_percentile < 100 else math.inf,
        )
        self.language_cuts = {
            language: (
                float(_rescale(np.array(self.cuts[0]), source, located))
                if self.low_percentile > 0
                else -math.inf,
                float(_rescale(np.array(self.cuts[1]), source, located))
                if self.high_percentile < 100
                else math.inf,
            )
            for language, located in own.items()
        }
        return self

    def score(self, texts: list[str], **inputs: list[Any]) -> dict[str, np.ndarray]:
        if self.cuts is None:
            self.fit(texts, **inputs)
        languages = inputs.get("language") or [None] * len(texts)
        # The language whose cut judges each document (None: the source-wide cut).
        settings = np.array(
            [lang if lang in self.language_cuts else None for lang in languages], dtype=object
        )
        if self.model is None:
            return {"perplexity": np.full(len(texts), np.nan), "perplexity_settings": settings}
        perplexity = np.array([self.model.perplexity(text) for text in texts], dtype=np.float64)
        return {"perplexity": perplexity, "perplexity_settings": settings}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        assert self.cuts is not None, "score() fits the filter before decide()"
        low, high = self.language_cuts.get(scores["perplexity_settings"], self.cuts)
        perplexity = scores["perplexity"]
        if perplexity < low:
            return "perplexity_too_low"
        if perplexity > high:
            return "perplexity_too_high"
        return None
