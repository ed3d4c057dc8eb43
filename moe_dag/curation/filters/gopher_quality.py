"""Gopher quality rules, deciding as datatrove's `GopherQualityFilter` does.

Gopher (Rae et al. 2021, arXiv:2112.11446, appendix A) keeps documents of 50..100,000 words with a mean
word length of 3..10 characters, at most 0.1 "#" and at most 0.1 ellipses per word, at most 90% of lines
starting with a bullet and 30% ending with an ellipsis, at least 80% of words containing a letter, and
at least two of the English stop words "the, be, to, of, and, that, have, with". datatrove's reading,
followed here rule for rule: words are NLTK tokens (`text.split_words`), punctuation tokens count in the
per-word ratios but not in the length rules, lines are `str.splitlines()`, stop words match case-sensitively.

Departures, each a setting whose reference value `PrefilterConfig.reference()` restores:
- `ScriptRules.line_rules_min_lines` (reference 1): the bullet and ellipsis line fractions of a one-line
  document can only be 0 or 1, so they are not applied below 2 lines.
- `ScriptRules.per_script` (reference off): in Chinese, Japanese, Thai, Lao, Khmer, Myanmar and Tibetan a
  whitespace token is a phrase, so each letter of those scripts counts as a word and the mean word length
  and the English stop-word rule are not applied (FineWeb-2 also adapts these rules per language).
- `stop_word_languages` (reference: every document): the English stop-word rule applies only to
  documents that language ID found in one of these languages (or that no language ID ran on).

Opt-in per kind of source (off here and in the reference, on for `kind: reference`):
- `word_placeholders`: markers a tokenised dump writes in place of a word (WikiText's `<unk>`) count as
  one word made of their letters; datatrove splits `<unk>` into `<`, `unk`, `>`, two punctuation tokens
  against the alphabetic-word share for every word the dump's vocabulary lacked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.text import (
    PUNCTUATION_SET,
    ScriptRules,
    mostly_unspaced,
    split_words,
    unspaced_letter_count,
)

_SYMBOLS_ONLY = re.compile("[" + re.escape("".join(sorted(PUNCTUATION_SET))) + "]+")
_BULLETS = ("•", "-")
_ELLIPSES = ("...", "…")

_COLUMNS = {
    "gopher_word_count": np.int64,
    "gopher_mean_word_length": np.float64,
    "gopher_hash_ratio": np.float64,
    "gopher_ellipsis_ratio": np.float64,
    "gopher_bullet_line_fraction": np.float64,
    "gopher_ellipsis_line_fraction": np.float64,
    "gopher_alphabetic_word_fraction": np.float64,
    "gopher_stop_words": np.int64,
    "gopher_line_count": np.int64,
}


@dataclass(kw_only=True)
class GopherQualityConfig:
    """datatrove's defaults; 0 turns a rule off."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3
    max_mean_word_length: float = 10
    max_symbol_word_ratio: float = 0.1
    max_bullet_line_fraction: float = 0.9
    max_ellipsis_line_fraction: float = 0.3
    min_alphabetic_word_fraction: float = 0.8
    min_stop_words: int = 2
    stop_words: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")
    stop_word_languages: tuple[str, ...] = ("en",)
    word_placeholders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.min_words > self.max_words:
            raise ValueError(f"gopher_quality: min_words={self.min_words} > max_words={self.max_words}")
        if self.min_mean_word_length > self.max_mean_word_length:
            raise ValueError(
                f"gopher_quality: min_mean_word_length={self.min_mean_word_length} > "
                f"max_mean_word_length={self.max_mean_word_length}"
            )
        self.stop_words = tuple(self.stop_words)  # YAML gives lists
        self.stop_word_languages = tuple(self.stop_word_languages)
        self.word_placeholders = tuple(self.word_placeholders)
        wordless = [marker for marker in self.word_placeholders if not any(map(str.isalpha, marker))]
        if wordless:
            raise ValueError(f"gopher_quality.word_placeholders {wordless}: no letter to count as a word")


# The field of `GopherQualityConfig` that governs each reason.
REASON_SETTINGS: dict[str, str | None] = {
    "gopher_too_few_words": "min_words",
    "gopher_too_many_words": "max_words",
    "gopher_mean_word_length_too_short": "min_mean_word_length",
    "gopher_mean_word_length_too_long": "max_mean_word_length",
    "gopher_too_many_hashes": "max_symbol_word_ratio",
    "gopher_too_many_ellipses": "max_symbol_word_ratio",
    "gopher_too_many_bullet_lines": "max_bullet_line_fraction",
    "gopher_too_many_ellipsis_lines": "max_ellipsis_line_fraction",
    "gopher_too_few_alphabetic_words": "min_alphabetic_word_fraction",
    "gopher_too_few_stop_words": "min_stop_words",
}


class GopherQualityFilter(DocumentFilter):
    """Drop documents too short or long, of odd word length, symbol-heavy, list-like or without stop words."""

    name = "gopher_quality"
    reasons = (
        "gopher_too_few_words",
        "gopher_too_many_words",
        "gopher_mean_word_length_too_short",
        "gopher_mean_word_length_too_long",
        "gopher_too_many_hashes",
        "gopher_too_many_ellipses",
        "gopher_too_many_bullet_lines",
        "gopher_too_many_ellipsis_lines",
        "gopher_too_few_alphabetic_words",
        "gopher_too_few_stop_words",
    )
    inputs = ("language",)

    def __init__(self, config: GopherQualityConfig | None = None, script: ScriptRules | None = None) -> None:
        self.config = config or GopherQualityConfig()
        self.script = script or ScriptRules()
        self.stop_words = frozenset(self.config.stop_words)
        # Each marker becomes its letters ("<unk>" -> "unk"): one alphabetic token, as the word it stands for.
        self.placeholder_words = {
            marker: "".join(filter(str.isalpha, marker)) for marker in self.config.word_placeholders
        }

    def score(self, texts: list[str], language: list[str | None] | None = None) -> dict[str, np.ndarray]:
        languages = language or [None] * len(texts)
        rows = [self._stats(text, lang) for text, lang in zip(texts, languages, strict=True)]
        return {
            name: np.array([row[k] for row in rows], dtype=dtype).reshape(len(texts))
            for k, (name, dtype) in enumerate(_COLUMNS.items())
        }

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        c = self.config
        words, mean_length = scores["gopher_word_count"], scores["gopher_mean_word_length"]
        line_rules = scores["gopher_line_count"] >= self.script.line_rules_min_lines
        checks = (
            (c.min_words, words < (c.min_words or 0), "gopher_too_few_words"),
            (c.max_words, words > (c.max_words or 0), "gopher_too_many_words"),
            (
                c.min_mean_word_length,
                mean_length < (c.min_mean_word_length or 0),
                "gopher_mean_word_length_too_short",
            ),
            (
                c.max_mean_word_length,
                mean_length > (c.max_mean_word_length or 0),
                "gopher_mean_word_length_too_long",
            ),
            (
                c.max_symbol_word_ratio,
                scores["gopher_hash_ratio"] > (c.max_symbol_word_ratio or 0),
                "gopher_too_many_hashes",
            ),
            (
                c.max_symbol_word_ratio,
                scores["gopher_ellipsis_ratio"] > (c.max_symbol_word_ratio or 0),
                "gopher_too_many_ellipses",
            ),
            (
                c.max_bullet_line_fraction and line_rules,
                scores["gopher_bullet_line_fraction"] > (c.max_bullet_line_fraction or 0),
                "gopher_too_many_bullet_lines",
            ),
            (
                c.max_ellipsis_line_fraction and line_rules,
                scores["gopher_ellipsis_line_fraction"] > (c.max_ellipsis_line_fraction or 0),
                "gopher_too_many_ellipsis_lines",
            ),
            (
                c.min_alphabetic_word_fraction,
                scores["gopher_alphabetic_word_fraction"] < (c.min_alphabetic_word_fraction or 0),
                "gopher_too_few_alphabetic_words",
            ),
            (
                c.min_stop_words and scores["gopher_stop_words"] >= 0,
                scores["gopher_stop_words"] < (c.min_stop_words or 0),
                "gopher_too_few_stop_words",
            ),
        )
        for enabled, failed, code in checks:
            if enabled and failed:
                return code
        return None

    def _stats(self, text: str, language: str | None) -> tuple[float, ...]:
        c = self.config
        words = split_words(self._placeholders_as_words(text))
        non_symbol = [w for w in words if not _SYMBOLS_ONLY.fullmatch(w)]
        n_words, n_counted = len(words), len(non_symbol)
        # datatrove's test, `str.isalpha`: "½", "²" and "Ⅻ" are numbers, not letters.
        alphabetic = sum(1 for w in words if any(ch.isalpha() for ch in w))
        mean_length = sum(map(len, non_symbol)) / n_counted if n_counted else float("nan")
        languages = c.stop_word_languages
        stop_rule = not languages or language is None or language in languages
        if self.script.per_script and mostly_unspaced(text):
            # Chinese, Japanese, Thai, ...: a token is a phrase, so each of its letters counts as a word,
            # and word length says nothing.
            phrases = [w for w in words if unspaced_letter_count(w)]
            letters = sum(map(unspaced_letter_count, phrases))
            n_words += letters - len(phrases)
            n_counted += letters - len(phrases)
            alphabetic += letters - len(phrases)
            mean_length = float("nan")
            stop_rule = False  # English stop words
        lines = text.splitlines()
        n_lines = max(len(lines), 1)
        per_word = max(n_words, 1)
        return (
            n_counted,
            mean_length,
            text.count("#") / per_word,
            (text.count("...") + text.count("…")) / per_word,
            sum(line.lstrip().startswith(_BULLETS) for line in lines) / n_lines,
            sum(line.rstrip().endswith(_ELLIPSES) for line in lines) / n_lines,
            alphabetic / per_word,
            len(self.stop_words.intersection(words)) if stop_rule else -1,
            len(lines),
        )

    def _placeholders_as_words(self, text: str) -> str:
        for marker, word in self.placeholder_words.items():
            text = text.replace(marker, word)
        return text
