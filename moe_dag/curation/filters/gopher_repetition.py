"""Gopher repetition rules, deciding as datatrove's `GopherRepetitionFilter` does.

Gopher (Rae et al. 2021, arXiv:2112.11446, table A1) drops a document when
- more than 30% of its paragraphs (split at blank lines) repeat an earlier one, or the repeats hold more
  than 20% of its characters; the same for lines (split at newlines, empty ones included);
- the most frequent 2-, 3- or 4-gram of words, counted in all its occurrences and joined by spaces,
  covers more than 20%, 18%, 16% of the characters;
- n-grams that repeat an earlier n-gram cover more than 15%, 14%, 13%, 12%, 11%, 10% of the characters
  for n = 5..10, reading left to right and jumping past each repeat (datatrove's `find_all_duplicate`,
  which joins a repeated n-gram's words without spaces).
Words are NLTK tokens (`text.split_words`); every fraction is over the document's characters.

The n-grams are integer keys built from word ids in numpy, one vectorised pass per n. The left-to-right
scan only visits the positions whose n-gram occurs more than once: a unique n-gram can neither repeat
nor make a later one a repeat, so skipping it changes nothing.

Departure (`top_ngram_min_count`, reference 1): the most frequent n-gram must occur at least
twice. With the reference, a short text whose n-grams are all different still "repeats" its first
n-gram, and a clean two-sentence answer is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.text import duplicates, split_words

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_LINE_BREAK = re.compile(r"\n+")
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplying by it is a bijection modulo 2^64


@dataclass(kw_only=True)
class GopherRepetitionConfig:
    """datatrove's defaults; 0 turns a fraction rule off, and an n-gram size left out of a table is not
    checked."""

    max_duplicate_paragraph_fraction: float = 0.3
    max_duplicate_paragraph_char_fraction: float = 0.2
    max_duplicate_line_fraction: float = 0.3
    max_duplicate_line_char_fraction: float = 0.2
    max_top_ngram_char_fraction: dict[int, float] = field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    top_ngram_min_count: int = 2
    max_duplicate_ngram_char_fraction: dict[int, float] = field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )

    def __post_init__(self) -> None:
        for name in ("max_top_ngram_char_fraction", "max_duplicate_ngram_char_fraction"):
            if any(int(n) < 1 for n in getattr(self, name)):
                raise ValueError(
                    f"gopher_repetition.{name}: n-gram sizes must be >= 1, got {getattr(self, name)}"
                )
            # YAML keys may arrive as strings ("2": 0.2).
            setattr(self, name, {int(n): float(v) for n, v in getattr(self, name).items()})


# The field of `GopherRepetitionConfig` that governs each reason (n-gram bounds by n).
REASON_SETTINGS: dict[str, str | None] = {
    "gopher_empty_document": None,
    "gopher_duplicate_paragraphs": "max_duplicate_paragraph_fraction",
    "gopher_duplicate_paragraph_chars": "max_duplicate_paragraph_char_fraction",
    "gopher_duplicate_lines": "max_duplicate_line_fraction",
    "gopher_duplicate_line_chars": "max_duplicate_line_char_fraction",
    **{f"gopher_top_{n}gram_chars": f"max_top_ngram_char_fraction.{n}" for n in range(1, 21)},
    **{f"gopher_duplicate_{n}gram_chars": f"max_duplicate_ngram_char_fraction.{n}" for n in range(1, 21)},
}


class GopherRepetitionFilter(DocumentFilter):
    """Drop documents that repeat their own paragraphs, lines or phrases."""

    name = "gopher_repetition"

    def __init__(self, config: GopherRepetitionConfig | None = None) -> None:
        self.config = config = config or GopherRepetitionConfig()
        self.top_ns = sorted(config.max_top_ngram_char_fraction)
        self.duplicate_ns = sorted(config.max_duplicate_ngram_char_fraction)
        self.columns = [
            "gopher_duplicate_paragraph_fraction",
            "gopher_duplicate_paragraph_char_fraction",
            "gopher_duplicate_line_fraction",
            "gopher_duplicate_line_char_fraction",
            *(f"gopher_top_{n}gram_char_fraction" for n in self.top_ns),
            *(f"gopher_duplicate_{n}gram_char_fraction" for n in self.duplicate_ns),
        ]
        self.reasons = (
            "gopher_empty_document",
            "gopher_duplicate_paragraphs",
            "gopher_duplicate_paragraph_chars",
            "gopher_duplicate_lines",
            "gopher_duplicate_line_chars",
            *(f"gopher_top_{n}gram_chars" for n in self.top_ns),
            *(f"gopher_duplicate_{n}gram_chars" for n in self.duplicate_ns),
        )

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        rows = np.array([self._stats(text) for text in texts], dtype=np.float64)
        rows = rows.reshape(len(texts), len(self.columns))
        return {name: rows[:, k] for k, name in enumerate(self.columns)}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        c = self.config
        if not text:
            return "gopher_empty_document"
        limits = [
            (c.max_duplicate_paragraph_fraction, "paragraph_fraction", "paragraphs"),
            (c.max_duplicate_paragraph_char_fraction, "paragraph_char_fraction", "paragraph_chars"),
            (c.max_duplicate_line_fraction, "line_fraction", "lines"),
            (c.max_duplicate_line_char_fraction, "line_char_fraction", "line_chars"),
        ]
        for limit, column, code in limits:
            if limit and scores[f"gopher_duplicate_{column}"] > limit:
                return f"gopher_duplicate_{code}"
        for n in self.top_ns:
            if scores[f"gopher_top_{n}gram_char_fraction"] > c.max_top_ngram_char_fraction[n]:
                return f"gopher_top_{n}gram_chars"
        for n in self.duplicate_ns:
            if scores[f"gopher_duplicate_{n}gram_char_fraction"] > c.max_duplicate_ngram_char_fraction[n]:
                return f"gopher_duplicate_{n}gram_chars"
        return None

    def _stats(self, text: str) -> list[float]:
        if not text:
            return [0.0] * len(self.columns)
        n_chars = len(text)
        paragraphs = _PARAGRAPH_BREAK.split(text.strip())
        paragraph_dups, paragraph_dup_chars = duplicates(paragraphs)
        lines = _LINE_BREAK.split(text)
        line_dups, line_dup_chars = duplicates(lines)
        words = split_words(text)
        vocabulary: dict[str, int] = {}
        ids = np.fromiter((vocabulary.setdefault(w, len(vocabulary)) for w in words), np.uint64, len(words))
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        min_count = self.config.top_ngram_min_count
        return [
            paragraph_dups / len(paragraphs),
            paragraph_dup_chars / n_chars,
            line_dups / len(lines),
            line_dup_chars / n_chars,
            *(_top_ngram_chars(ids, lengths, n, min_count) / n_chars for n in self.top_ns),
            *(_duplicate_ngram_chars(ids, lengths, n) / n_chars for n in self.duplicate_ns),
        ]


def _ngram_keys(ids: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit key per n-gram start (len(ids) - n + 1 keys), equal for equal n-grams."""
    keys = ids[: len(ids) - n + 1].copy()
    for k in range(1, n):
        keys = keys * _HASH_BASE + ids[k : len(ids) - n + 1 + k]
    return keys


def _window_sums(lengths: np.ndarray, n: int) -> np.ndarray:
    """Characters of the words in each n-gram window."""
    return np.convolve(lengths, np.ones(n, dtype=np.int64), mode="valid")


def _top_ngram_chars(ids: np.ndarray, lengths: np.ndarray, n: int, min_count: int) -> int:
    """Characters covered by the most frequent n-gram (the first seen on ties), joined by spaces."""
    if len(ids) < n:
        return 0
    _, first, counts = np.unique(_ngram_keys(ids, n), return_index=True, return_counts=True)
    top = counts.max()
    if top < min_count:
        return 0
    start = first[counts == top].min()
    return int(top * (lengths[start : start + n].sum() + n - 1))


def _duplicate_ngram_chars(ids: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters of repeated n-grams met reading left to right, jumping past each repeat."""
    if len(ids) < n:
        return 0
    keys = _ngram_keys(ids, n)
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    candidates = np.flatnonzero(counts[inverse] > 1)
    if len(candidates) == 0:
        return 0
    chars = _window_sums(lengths, n)
    seen: set[int] = set()
    repeated, next_visit = 0, 0
    for position, key in zip(candidates.tolist(), inverse[candidates].tolist(), strict=True):
        if position < next_visit:
            continue
        if key in seen:
            repeated += int(chars[position])
            next_visit = position + n
        else:
            seen.add(key)
    return repeated
