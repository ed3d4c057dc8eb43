"""Toxicity: a trained classifier scored per line, and a word blocklist.

The classifier is alt-profanity-check's calibrated linear SVM over TF-IDF word features, trained on toxic
comments and shipped inside the package. It was trained on single comments, so a document is split
into lines and it drops when enough lines score above `max_line_probability`. Every line of every
document in a batch goes through one `predict_prob` call: the vectoriser dominates the cost and it is
far faster on one sparse matrix than on many.

Thresholds were picked on Python's standard library: of its 74,000 lines of three words or more, 2 score
above 0.99 ("'.ass': 'audio/aac'", "we may as well suck up the matching junk") and none of its "kill",
"abort", "dummy", "execute" or "garbage" lines do (the highest, "kill = terminate", scores 0.95); plain
insults ("you are a stupid worthless idiot") score 0.999 and more.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter

# Whole-word obscenities and slurs that drop a document wherever they appear (the C4 approach, kept
# minimal: ambiguous words such as "ass" or "retard" also name file types and physics). Written in
# ROT13 so the list does not show up when someone greps the code.
_BLOCKLIST_ROT13 = (
    "shpx",
    "shpxf",
    "shpxvat",
    "shpxrq",
    "shpxre",
    "zbgureshpxre",
    "phag",
    "avttre",
    "avttref",
    "snttbg",
    "snttbgf",
    "xvxr",
    "jrgonpx",
)


@dataclass(kw_only=True)
class ToxicityConfig:
    max_line_probability: float = 0.99
    # Lines with fewer words are not scored: one word ("damn", "kill") is too little for the classifier.
    min_line_words: int = 3
    min_toxic_lines: int = 1
    # Code files are long and the classifier reads identifiers ("kill", "dummy") as forum speech, so a
    # single chance line is weaker evidence there.
    min_toxic_lines_code: int = 2
    extra_blocklist: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 < self.max_line_probability < 1.0:
            raise ValueError(
                f"ToxicityConfig.max_line_probability must lie in (0, 1), got {self.max_line_probability}"
            )
        if min(self.min_toxic_lines, self.min_toxic_lines_code, self.min_line_words) < 1:
            raise ValueError(
                "ToxicityConfig: min_toxic_lines, min_toxic_lines_code, min_line_words must be >= 1"
            )


class ToxicLinesFilter(DocumentFilter):
    """Drop documents with at least `min_toxic_lines` lines the classifier calls toxic."""

    name = "toxicity_classifier"
    reasons = ("toxic_lines",)

    def __init__(self, *, max_line_probability: float, min_line_words: int, min_toxic_lines: int) -> None:
        from profanity_check import predict_prob

        self._predict_prob = predict_prob
        self.max_line_probability = max_line_probability
        self.min_line_words = min_line_words
        self.min_toxic_lines = min_toxic_lines

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        lines: list[str] = []
        owner: list[int] = []
        for i, text in enumerate(texts):
            for line in text.split("\n"):
                if len(line.split()) >= self.min_line_words:
                    lines.append(line)
                    owner.append(i)
        toxicity_max = np.zeros(len(texts), dtype=np.float32)
        toxic_lines = np.zeros(len(texts), dtype=np.int64)
        if lines:
            probability = self._predict_prob(lines)
            np.maximum.at(toxicity_max, owner, probability)
            np.add.at(toxic_lines, owner, probability > self.max_line_probability)
        return {"toxicity_max": toxicity_max, "toxic_lines": toxic_lines}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        return "toxic_lines" if scores["toxic_lines"] >= self.min_toxic_lines else None


class BlocklistFilter(DocumentFilter):
    """Drop documents containing any blocklisted word, matched whole and case-insensitively."""

    name = "blocklist"
    reasons = ("blocklisted_word",)

    def __init__(self, words: list[str]) -> None:
        if not words:
            raise ValueError("BlocklistFilter needs at least one word")
        alternatives = "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))
        self._pattern = re.compile(rf"\b(?:{alternatives})\b", re.IGNORECASE)

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        hits = [len(self._pattern.findall(text)) for text in texts]
        return {"blocklisted_words": np.array(hits, dtype=np.int64)}

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        return "blocklisted_word" if scores["blocklisted_words"] > 0 else None


def build_toxicity_filters(config: ToxicityConfig, kind: str) -> list[DocumentFilter]:
    """The word list first (cheap, certain), then the classifier, for a source of this `kind`."""
    words = [codecs.decode(w, "rot13") for w in _BLOCKLIST_ROT13] + list(config.extra_blocklist)
    min_toxic_lines = config.min_toxic_lines_code if kind == "code" else config.min_toxic_lines
    return [
        BlocklistFilter(words),
        ToxicLinesFilter(
            max_line_probability=config.max_line_probability,
            min_line_words=config.min_line_words,
            min_toxic_lines=min_toxic_lines,
        ),
    ]
