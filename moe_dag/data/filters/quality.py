"""Document quality rules for natural-language text: Gopher quality, FineWeb line rules, C4 lorem ipsum.

Sources, with the thresholds they published (the defaults in `PrefilterConfig`):
- Gopher (Rae et al. 2021, arXiv:2112.11446, appendix A): 50..100,000 words, mean word length 3..10,
  symbol-to-word ratio <= 0.1 ("#" and ellipses), <= 90% of lines starting with a bullet, <= 30% ending
  with an ellipsis, >= 80% of words containing a letter.
- FineWeb (Penedo et al. 2024, arXiv:2406.17557): >= 12% of lines end in terminal punctuation,
  <= 67% of lines are at most 30 characters.
- C4 (Raffel et al. 2020, arXiv:1910.10683): placeholder "lorem ipsum" text.
Gopher's English stop-word rule is left out: the corpus is multilingual.

Statistics are computed in `score` so they are kept as columns; `decide` is early returns in the order
above, cheapest evidence first.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter

if TYPE_CHECKING:
    from moe_dag.data.filters.prefilter import PrefilterConfig

_PUNCTUATION = string.punctuation + "…“”‘’«»—–·•"
_BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "‣", "⁃", "◦", "-", "*")
_ELLIPSES = ("...", "…")
_TERMINAL_PUNCTUATION = (".", "!", "?", '"', "'", "”", "’", "…", ":", ";", "。", "！", "？", "」", "؟", "।")

_STAT_TYPES = {
    "word_count": np.int64,
    "mean_word_length": np.float32,
    "symbol_to_word_ratio": np.float32,
    "bullet_line_fraction": np.float32,
    "ellipsis_line_fraction": np.float32,
    "alphabetic_word_fraction": np.float32,
    "punctuated_line_fraction": np.float32,
    "short_line_fraction": np.float32,
}


class TextQualityFilter(DocumentFilter):
    """Gopher quality rules plus FineWeb's line rules and C4's placeholder-text rule."""

    name = "text_quality"
    reasons = (
        "too_few_words",
        "too_many_words",
        "mean_word_length_too_short",
        "mean_word_length_too_long",
        "symbol_ratio_too_high",
        "too_many_bullet_lines",
        "too_many_ellipsis_lines",
        "too_few_alphabetic_words",
        "too_few_punctuated_lines",
        "too_many_short_lines",
        "lorem_ipsum",
    )

    def __init__(self, config: PrefilterConfig) -> None:
        self.config = config

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        rows = [_text_stats(text, self.config.short_line_chars) for text in texts]
        return {
            name: np.array([row[k] for row in rows], dtype=dtype)
            for k, (name, dtype) in enumerate(_STAT_TYPES.items())
        }

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        c = self.config
        if scores["word_count"] < c.min_words:
            return "too_few_words"
        if scores["word_count"] > c.max_words:
            return "too_many_words"
        if scores["mean_word_length"] < c.min_mean_word_length:
            return "mean_word_length_too_short"
        if scores["mean_word_length"] > c.max_mean_word_length:
            return "mean_word_length_too_long"
        if scores["symbol_to_word_ratio"] > c.max_symbol_to_word_ratio:
            return "symbol_ratio_too_high"
        if scores["bullet_line_fraction"] > c.max_bullet_line_fraction:
            return "too_many_bullet_lines"
        if scores["ellipsis_line_fraction"] > c.max_ellipsis_line_fraction:
            return "too_many_ellipsis_lines"
        if scores["alphabetic_word_fraction"] < c.min_alphabetic_word_fraction:
            return "too_few_alphabetic_words"
        if scores["punctuated_line_fraction"] < c.min_punctuated_line_fraction:
            return "too_few_punctuated_lines"
        if scores["short_line_fraction"] > c.max_short_line_fraction:
            return "too_many_short_lines"
        if "lorem ipsum" in text.lower():
            return "lorem_ipsum"
        return None


def _text_stats(text: str, short_line_chars: int) -> tuple[float, ...]:
    """The `_STAT_TYPES` statistics of one document, in that order."""
    # Gopher counts words without the tokens that are only punctuation ("-", "...", "--").
    words = [w for w in text.split() if w.strip(_PUNCTUATION)]
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line]
    n_words = max(len(words), 1)
    n_lines = max(len(lines), 1)
    symbols = text.count("#") + sum(text.count(e) for e in _ELLIPSES)
    return (
        len(words),
        sum(map(len, words)) / n_words,
        symbols / n_words,
        sum(line.startswith(_BULLETS) for line in lines) / n_lines,
        sum(line.endswith(_ELLIPSES) for line in lines) / n_lines,
        sum(any(ch.isalpha() for ch in w) for w in words) / n_words,
        sum(line.endswith(_TERMINAL_PUNCTUATION) for line in lines) / n_lines,
        sum(len(line) <= short_line_chars for line in lines) / n_lines,
    )
