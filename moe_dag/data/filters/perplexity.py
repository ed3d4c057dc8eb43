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

`PerplexityFilter` needs the source's whole distribution before it can cut, so it is a whole-table filter
(`run_filters` gives it every row still kept at once). Fitted once (`fit`), it is a plain per-document
filter and pickles small, so a Ray actor can build it from a fitted copy.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter

_TOKEN = re.compile(r"\w+|[^\w\s]")
_START, _UNKNOWN = 0, 1  # reserved word ids


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
    sample_documents: int = 100_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.low_percentile < self.high_percentile <= 100.0:
            raise ValueError("perplexity: need 0 <= low_percentile < high_percentile <= 100")


# The field of `PerplexityConfig` that governs each reason.
REASON_SETTINGS: dict[str, str | None] = {
    "perplexity_too_low": "low_percentile",
    "perplexity_too_high": "high_percentile",
}


class PerplexityFilter(DocumentFilter):
    """Drop documents whose perplexity lies below or above the given percentiles of the source's."""

    name = "perplexity"
    reasons = ("perplexity_too_low", "perplexity_too_high")
    whole_table = True

    def __init__(
        self,
        *,
        low_percentile: float,
        high_percentile: float,
        order: int = 3,
        reference_documents: int = 2000,
        min_documents: int = 100,
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
        self.reference_texts = reference_texts
        self.seed = seed
        self.model: NgramLanguageModel | None = None
        self.cuts: tuple[float, float] | None = None

    def fit(self, texts: list[str]) -> PerplexityFilter:
        """Train the model (on `reference_texts`, else a sample of `texts`) and set the cuts from `texts`.

        With fewer than `min_documents` texts there is no distribution to cut: every document is kept.
        """
        if len(texts) < self.min_documents:
            self.cuts = (-math.inf, math.inf)
            return self
        reference = self.reference_texts
        if reference is None:
            reference = random.Random(self.seed).sample(texts, min(self.reference_documents, len(texts)))
        self.model = NgramLanguageModel.fit(reference, order=self.order)
        scores = np.array([self.model.perplexity(text) for text in texts])
        scores = scores[~np.isnan(scores)]
        low, high = (
            np.percentile(scores, [self.low_percentile, self.high_percentile]) if len(scores) else (0, 0)
        )
        self.cuts = (
            float(low) if self.low_percentile > 0 else -math.inf,
            float(high) if self.high_percentile < 100 else math.inf,
        )
        return self

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        if self.cuts is None:
            self.fit(texts)
        if self.model is None:
            return {"perplexity": np.full(len(texts), np.nan)}
        return {"perplexity": np.array([self.model.perplexity(text) for text in texts], dtype=np.float64)}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        assert self.cuts is not None, "score() fits the filter before decide()"
        perplexity = scores["perplexity"]
        if perplexity < self.cuts[0]:
            return "perplexity_too_low"
        if perplexity > self.cuts[1]:
            return "perplexity_too_high"
        return None
