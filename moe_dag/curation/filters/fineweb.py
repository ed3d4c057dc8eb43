"""FineWeb's own quality rules, deciding as datatrove's `FineWebQualityFilter` does.

FineWeb (Penedo et al. 2024, arXiv:2406.17557, section 3.3) drops a document when, over its non-blank
lines (not stripped), fewer than 12% end in terminal punctuation (Unicode's Sentence_Terminal set),
more than 67% are at most 30 characters, the lines that repeat an earlier line hold more than 1% of
its characters (newlines not counted), or it has more than 0.3 newlines per word (NLTK tokens).

Departure (`ScriptRules.line_rules_min_lines`, reference 1): the punctuation and short-line fractions are not
applied to documents of fewer lines: a one-line answer without a final full stop would score 0 and drop.
Departure (`ScriptRules.per_script`, reference off): a Thai or Lao line, whose script has no terminator,
counts as punctuated when it ends in a letter, each of its letters is a word in the newline rule, and
a letter of a script written without spaces counts
as `UNSPACED_LETTER_CHARS` characters in the short-line rule: a 17-character Chinese sentence says what
an English one says in about 50, and all of a Chinese page's lines were "short".
`min_punctuated_line_fraction: 0.0` turns the punctuation rule off for a source (UI strings,
code comments) where lines rarely end in punctuation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.text import (
    TERMINAL_PUNCTUATION,
    ScriptRules,
    approximate_word_count,
    duplicates,
    ends_sentence_any_script,
    mostly_unspaced,
    split_words,
    unspaced_letter_count,
)

# Characters of English text per letter of Chinese (Japanese, Thai, ...) text saying the same: a
# translated sentence of the tests runs 17 characters in Chinese and 50-60 in English.
UNSPACED_LETTER_CHARS = 3

_COLUMNS = {
    "fineweb_line_count": np.int64,
    "fineweb_punctuated_line_fraction": np.float64,
    "fineweb_short_line_fraction": np.float64,
    "fineweb_duplicate_line_char_fraction": np.float64,
    "fineweb_newline_word_ratio": np.float64,
}


@dataclass(kw_only=True)
class FineWebConfig:
    """datatrove's defaults."""

    min_punctuated_line_fraction: float = 0.12
    punctuation_exclude_zero: bool = False
    max_short_line_fraction: float = 0.67
    short_line_chars: int = 30
    max_duplicate_line_char_fraction: float = 0.01
    max_newline_word_ratio: float = 0.3


# The field of `FineWebConfig` that governs each reason.
REASON_SETTINGS: dict[str, str | None] = {
    "fineweb_empty_document": None,
    "fineweb_too_few_punctuated_lines": "min_punctuated_line_fraction",
    "fineweb_too_many_short_lines": "max_short_line_fraction",
    "fineweb_duplicate_line_chars": "max_duplicate_line_char_fraction",
    "fineweb_too_many_newlines": "max_newline_word_ratio",
}


class FineWebQualityFilter(DocumentFilter):
    """Drop documents of unpunctuated, short or repeated lines, and lists."""

    name = "fineweb_quality"
    reasons = (
        "fineweb_empty_document",
        "fineweb_too_few_punctuated_lines",
        "fineweb_too_many_short_lines",
        "fineweb_duplicate_line_chars",
        "fineweb_too_many_newlines",
    )

    def __init__(self, config: FineWebConfig | None = None, script: ScriptRules | None = None) -> None:
        self.config = config or FineWebConfig()
        self.script = script or ScriptRules()

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        rows = [self._stats(text) for text in texts]
        return {
            name: np.array([row[k] for row in rows], dtype=dtype).reshape(len(texts))
            for k, (name, dtype) in enumerate(_COLUMNS.items())
        }

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        c = self.config
        n_lines = scores["fineweb_line_count"]
        if n_lines == 0:
            return "fineweb_empty_document"
        line_rules = n_lines >= self.script.line_rules_min_lines
        punctuated = scores["fineweb_punctuated_line_fraction"]
        if (
            line_rules
            and punctuated < c.min_punctuated_line_fraction
            and not (punctuated == 0 and c.punctuation_exclude_zero)
        ):
            return "fineweb_too_few_punctuated_lines"
        if line_rules and scores["fineweb_short_line_fraction"] > c.max_short_line_fraction:
            return "fineweb_too_many_short_lines"
        if scores["fineweb_duplicate_line_char_fraction"] > c.max_duplicate_line_char_fraction:
            return "fineweb_duplicate_line_chars"
        if scores["fineweb_newline_word_ratio"] > c.max_newline_word_ratio:
            return "fineweb_too_many_newlines"
        return None

    def _word_count(self, text: str) -> int:
        if self.script.per_script and mostly_unspaced(text):
            return approximate_word_count(text)  # a whitespace token of Chinese is a clause
        return len(split_words(text))

    def _stats(self, text: str) -> tuple[float, ...]:
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return (0, 0.0, 0.0, 0.0, 0.0)
        n_lines = len(lines)
        short = self.config.short_line_chars
        if self.script.per_script:
            punctuated = sum(1 for line in lines if ends_sentence_any_script(line))
            short_lines = sum(
                1
                for line in lines
                if len(line) + (UNSPACED_LETTER_CHARS - 1) * unspaced_letter_count(line) <= short
            )
        else:
            punctuated = sum(1 for line in lines if line.endswith(TERMINAL_PUNCTUATION))
            short_lines = sum(1 for line in lines if len(line) <= short)
        return (
            n_lines,
            punctuated / n_lines,
            short_lines / n_lines,
            duplicates(lines)[1] / max(len(text) - text.count("\n"), 1),
            text.count("\n") / max(self._word_count(text), 1),
        )
