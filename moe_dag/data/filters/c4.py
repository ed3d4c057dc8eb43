"""C4's rules, deciding as datatrove's `C4QualityFilter` does.

C4 (Raffel et al. 2020, arXiv:1910.10683, section 2.2; TensorFlow Datasets' `c4_utils.py`) reads a page
line by line (`str.splitlines`, stripped) and keeps only lines that end in terminal punctuation
(. ? ! " ', not an ellipsis), have at least 3 words, no word over 1,000 characters, and do not mention
javascript or a terms-of-use, privacy or cookie policy; Wikipedia citation marks ("[1]", "[edit]") are
removed first. The page is dropped if a kept line contains "lorem ipsum" or a curly bracket, or if the
kept lines hold fewer than 5 sentences (Punkt sentences, `text.count_sentences`).

datatrove also rewrites the text to the kept lines; moe-dag filters never edit a document, so the share
of lines C4 would remove is recorded (`c4_removed_line_fraction`) and the text stays as it was.

Departure (`line_rules_min_lines`, reference 1): a one-line document is not held to the terminal
punctuation line rule, so a long answer without a final full stop still counts its sentences.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from moe_dag.data.filters.base import DocumentFilter
from moe_dag.data.filters.text import count_sentences

if TYPE_CHECKING:
    from moe_dag.data.filters.prefilter import PrefilterConfig

_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
_END_PUNCTUATION = (".", "?", "!", '"', "'")
_POLICY_PHRASES = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
# What decides the page, in the order the line loop meets it.
_LOREM_IPSUM, _CURLY_BRACKET = -1, -2


class C4QualityFilter(DocumentFilter):
    """Drop pages with placeholder text, code braces, or fewer than 5 sentences in clean lines."""

    name = "c4_quality"
    reasons = ("c4_lorem_ipsum", "c4_curly_bracket", "c4_too_few_sentences")

    def __init__(self, config: PrefilterConfig) -> None:
        self.config = config

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        rows = [self._stats(text) for text in texts]
        return {
            "c4_sentences": np.array([row[0] for row in rows], dtype=np.int64),
            "c4_removed_line_fraction": np.array([row[1] for row in rows], dtype=np.float64),
        }

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        sentences = scores["c4_sentences"]
        if sentences == _LOREM_IPSUM:
            return "c4_lorem_ipsum"
        if sentences == _CURLY_BRACKET:
            return "c4_curly_bracket"
        if sentences < self.config.c4_min_sentences:
            return "c4_too_few_sentences"
        return None

    def _stats(self, text: str) -> tuple[int, float]:
        """Sentences in the kept lines (or a page-level code), and the share of lines removed."""
        c = self.config
        lines = text.splitlines()
        punctuation_rule = c.c4_filter_no_terminal_punct and len(lines) >= c.line_rules_min_lines
        enough = max(c.c4_min_sentences, 1)
        sentences, kept = 0, 0
        for raw in lines:
            line = raw.strip()
            words = line.split()
            if c.c4_max_word_length != -1 and any(len(word) > c.c4_max_word_length for word in words):
                continue
            if c.c4_remove_citations:
                line = _CITATION.sub("", line)
            if punctuation_rule and (not line.endswith(_END_PUNCTUATION) or line.endswith("...")):
                continue
            if len(words) < c.c4_min_words_per_line:
                continue
            lowered = line.lower()
            if c.c4_filter_lorem_ipsum and "lorem ipsum" in lowered:
                return _LOREM_IPSUM, 0.0
            if c.c4_filter_javascript and "javascript" in lowered:
                continue
            if c.c4_filter_curly_bracket and "{" in line:
                return _CURLY_BRACKET, 0.0
            if c.c4_filter_policy and any(phrase in lowered for phrase in _POLICY_PHRASES):
                continue
            kept += 1
            if sentences < enough:
                sentences += count_sentences(line, enough - sentences)
        return sentences, 1 - kept / len(lines) if lines else 0.0
