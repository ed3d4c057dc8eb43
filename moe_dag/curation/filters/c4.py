"""C4's rules, deciding as datatrove's `C4QualityFilter` does.

C4 (Raffel et al. 2020, arXiv:1910.10683, section 2.2; TensorFlow Datasets' `c4_utils.py`) reads a page
line by line (`str.splitlines`, stripped) and keeps only lines that end in terminal punctuation
(. ? ! " ', not an ellipsis), have at least 3 words, no word over 1,000 characters, and do not mention
javascript or a terms-of-use, privacy or cookie policy; Wikipedia citation marks ("[1]", "[edit]") are
removed first. The page is dropped if a kept line contains "lorem ipsum" or a curly bracket, or if the
kept lines hold fewer than 5 sentences (Punkt sentences, `text.count_sentences`).

datatrove also rewrites the text to the kept lines; moe-dag filters never edit a document, so the share
of lines C4 would remove is recorded (`c4_removed_line_fraction`) and the text stays as it was.

Departures (`ScriptRules`, whose reference values `PrefilterConfig.reference()` restores):
- `line_rules_min_lines` (reference 1): a one-line document is not held to the terminal punctuation line
  rule, so a long answer without a final full stop still counts its sentences.
- `per_script` (reference off): C4 was written for English. A line that ends in another script's
  terminator (。！？।۔։ ...) ends in terminal punctuation, a Thai or Lao line (no terminator) ends as its
  script does, letters of unspaced scripts count as words for the 3-word rule, and sentences are
  counted at every script's terminators (`text.count_sentences_any_script`). Lines in Latin script
  with ASCII punctuation are read exactly as C4 reads them.

Opt-in per kind of source (off here and in the reference, on for `kind: reference`):
- `language_variant_markup`: the braces of wiki language-variant markup `-{...}-` are not code. Serbian
  Wikipedia writes Latin names in Cyrillic text as `-{GNOME}-`; C4 drops such a page for its curly bracket.
  Any other brace in a kept line still drops the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.text import (
    ScriptRules,
    approximate_word_count,
    count_sentences,
    count_sentences_any_script,
    ends_sentence_any_script,
)

# Wiki language-variant markup: `-{text}-`, `-{R|text}-`, `-{zh-hans:...; zh-hant:...}-`.
_LANGUAGE_VARIANT = re.compile(r"-\{[^{}]*\}-")
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


@dataclass(kw_only=True)
class C4Config:
    """datatrove's defaults; -1 turns a numeric rule off."""

    min_sentences: int = 5
    min_words_per_line: int = 3
    max_word_length: int = 1000
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    language_variant_markup: bool = False


# The field of `C4Config` that governs each reason.
REASON_SETTINGS: dict[str, str | None] = {
    "c4_lorem_ipsum": "filter_lorem_ipsum",
    "c4_curly_bracket": "filter_curly_bracket",
    "c4_too_few_sentences": "min_sentences",
}


class C4QualityFilter(DocumentFilter):
    """Drop pages with placeholder text, code braces, or fewer than 5 sentences in clean lines."""

    name = "c4_quality"
    reasons = ("c4_lorem_ipsum", "c4_curly_bracket", "c4_too_few_sentences")

    def __init__(self, config: C4Config | None = None, script: ScriptRules | None = None) -> None:
        self.config = config or C4Config()
        self.script = script or ScriptRules()
        self._count_sentences = count_sentences_any_script if self.script.per_script else count_sentences

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
        if sentences < self.config.min_sentences:
            return "c4_too_few_sentences"
        return None

    def _stats(self, text: str) -> tuple[int, float]:
        """Sentences in the kept lines (or a page-level code), and the share of lines removed."""
        c, per_script = self.config, self.script.per_script
        lines = text.splitlines()
        punctuation_rule = c.filter_no_terminal_punct and len(lines) >= self.script.line_rules_min_lines
        enough = max(c.min_sentences, 1)
        sentences, kept = 0, 0
        for raw in lines:
            line = raw.strip()
            words = line.split()
            if c.max_word_length != -1 and any(len(word) > c.max_word_length for word in words):
                continue
            if c.remove_citations:
                line = _CITATION.sub("", line)
            if punctuation_rule and not _ends_in_punctuation(line, per_script):
                continue
            if (approximate_word_count(line) if per_script else len(words)) < c.min_words_per_line:
                continue
            lowered = line.lower()
            if c.filter_lorem_ipsum and "lorem ipsum" in lowered:
                return _LOREM_IPSUM, 0.0
            if c.filter_javascript and "javascript" in lowered:
                continue
            if c.filter_curly_bracket and "{" in _without_variant_markup(line, c.language_variant_markup):
                return _CURLY_BRACKET, 0.0
            if c.filter_policy and any(phrase in lowered for phrase in _POLICY_PHRASES):
                continue
            kept += 1
            if sentences < enough:
                sentences += self._count_sentences(line, enough - sentences)
        return sentences, 1 - kept / len(lines) if lines else 0.0


def _without_variant_markup(line: str, markup: bool) -> str:
    """`line` without its `-{...}-` spans where the source writes language-variant markup."""
    return _LANGUAGE_VARIANT.sub("", line) if markup and "-{" in line else line


def _ends_in_punctuation(line: str, per_script: bool) -> bool:
    """C4's line rule: ends in . ? ! " ' (not an ellipsis), or, per script, as its script ends a sentence."""
    if line.endswith("..."):
        return False
    return line.endswith(_END_PUNCTUATION) or (per_script and ends_sentence_any_script(line))
