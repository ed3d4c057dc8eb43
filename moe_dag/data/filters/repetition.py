"""Gopher repetition rules: duplicated lines and paragraphs, the most frequent n-gram, duplicated n-grams.

Gopher (Rae et al. 2021, arXiv:2112.11446, table A1) drops a document when
- more than 30% of its paragraphs (lines) are duplicates of an earlier one, or they hold more than
  20% of its characters;
- the most frequent 2-, 3- or 4-gram covers more than 20%, 18%, 16% of its characters;
- the n-grams that repeat an earlier n-gram cover more than 15%, 14%, 13%, 12%, 11%, 10% of its
  characters for n = 5..10, each character counted once even where repeated n-grams overlap.

The n-gram statistics run on integer word ids in numpy, one vectorised pass per n, rather than on
joined strings in a Counter: an n-gram is keyed by a polynomial hash of its word ids modulo 2^64.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter

if TYPE_CHECKING:
    from moe_dag.data.filters.prefilter import PrefilterConfig

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplying by it is a bijection modulo 2^64


class RepetitionFilter(DocumentFilter):
    """Drop documents that repeat their own lines, paragraphs or phrases."""

    name = "repetition"
    reasons = (
        "duplicate_paragraphs",
        "duplicate_paragraph_chars",
        "duplicate_lines",
        "duplicate_line_chars",
        "top_ngram_repetition",
        "duplicate_ngram_repetition",
    )

    def __init__(self, config: PrefilterConfig) -> None:
        self.config = config
        self.top_ns = sorted(config.max_top_ngram_char_fraction)
        self.duplicate_ns = sorted(config.max_duplicate_ngram_char_fraction)

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        columns = [
            "duplicate_paragraph_fraction",
            "duplicate_paragraph_char_fraction",
            "duplicate_line_fraction",
            "duplicate_line_char_fraction",
            *(f"top_{n}gram_char_fraction" for n in self.top_ns),
            *(f"duplicate_{n}gram_char_fraction" for n in self.duplicate_ns),
        ]
        rows = np.array([self._stats(text) for text in texts], dtype=np.float32).reshape(-1, len(columns))
        return {name: rows[:, k] for k, name in enumerate(columns)}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        c = self.config
        # Paragraphs first, as Gopher does: a repeated paragraph also repeats its lines, and the coarser
        # reason says more.
        if scores["duplicate_paragraph_fraction"] > c.max_duplicate_paragraph_fraction:
            return "duplicate_paragraphs"
        if scores["duplicate_paragraph_char_fraction"] > c.max_duplicate_paragraph_char_fraction:
            return "duplicate_paragraph_chars"
        if scores["duplicate_line_fraction"] > c.max_duplicate_line_fraction:
            return "duplicate_lines"
        if scores["duplicate_line_char_fraction"] > c.max_duplicate_line_char_fraction:
            return "duplicate_line_chars"
        for n in self.top_ns:
            if scores[f"top_{n}gram_char_fraction"] > c.max_top_ngram_char_fraction[n]:
                return "top_ngram_repetition"
        for n in self.duplicate_ns:
            if scores[f"duplicate_{n}gram_char_fraction"] > c.max_duplicate_ngram_char_fraction[n]:
                return "duplicate_ngram_repetition"
        return None

    def _stats(self, text: str) -> list[float]:
        n_chars = max(len(text), 1)
        paragraph_dups, paragraph_dup_chars = _duplicates(_PARAGRAPH_BREAK.split(text.strip()))
        line_dups, line_dup_chars = _duplicates([line for line in text.split("\n") if line.strip()])
        words = text.split()
        vocabulary: dict[str, int] = {}
        ids = np.fromiter((vocabulary.setdefault(w, len(vocabulary)) for w in words), np.uint64, len(words))
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        return [
            paragraph_dups,
            paragraph_dup_chars / n_chars,
            line_dups,
            line_dup_chars / n_chars,
            *(_top_ngram_chars(ids, lengths, n) / n_chars for n in self.top_ns),
            *(_duplicate_ngram_chars(ids, lengths, n) / n_chars for n in self.duplicate_ns),
        ]


def _duplicates(elements: list[str]) -> tuple[float, int]:
    """Fraction of `elements` equal to an earlier one, and the characters those repeats hold."""
    seen: set[str] = set()
    repeats, repeat_chars = 0, 0
    for element in elements:
        if element in seen:
            repeats += 1
            repeat_chars += len(element)
        else:
            seen.add(element)
    return repeats / max(len(elements), 1), repeat_chars


def _ngram_keys(ids: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit key per n-gram start (len(ids) - n + 1 keys), equal for equal n-grams."""
    keys = ids[: len(ids) - n + 1].copy()
    for k in range(1, n):
        keys = keys * _HASH_BASE + ids[k : len(ids) - n + 1 + k]
    return keys


def _ngram_chars(lengths: np.ndarray, n: int) -> np.ndarray:
    """Characters in each n-gram, words joined by single spaces."""
    window_sums = np.convolve(lengths, np.ones(n, dtype=np.int64), mode="valid")
    return window_sums + (n - 1)


def _top_ngram_chars(ids: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters covered by the most frequent n-gram's occurrences (the longest one on ties)."""
    if len(ids) < n:
        return 0
    keys = _ngram_keys(ids, n)
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    chars = _ngram_chars(lengths, n)[first]
    top = counts == counts.max()
    return int(counts.max() * chars[top].max())


def _duplicate_ngram_chars(ids: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters of the words inside n-grams that repeat an earlier n-gram, each word counted once."""
    if len(ids) < n:
        return 0
    keys = _ngram_keys(ids, n)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    repeat_starts = np.flatnonzero(np.arange(len(keys)) != first[inverse])
    # Mark the n words under each repeated n-gram with a difference array, then sum covered lengths.
    cover = np.zeros(len(ids) + 1, dtype=np.int64)
    np.add.at(cover, repeat_starts, 1)
    np.add.at(cover, repeat_starts + n, -1)
    covered = np.cumsum(cover[:-1]) > 0
    return int(lengths[covered].sum())
