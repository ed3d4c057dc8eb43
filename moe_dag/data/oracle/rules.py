"""A deterministic rubric oracle computed from text statistics: the default where no LLM is available.

It answers in exactly the schema an LLM oracle does (the same rubrics, integer scores, validated), so the
rest of the pipeline runs unchanged on a laptop. The rules are coarse, but each score follows a
measurable property that the corresponding rubric dimension is about:

general text (0-4)
    correctness  starts at 4, loses points for symbol soup, tokens with no letters and repeated n-grams
                 or lines (the signatures of boilerplate, spam and broken extraction)
    coherence    starts at 4, loses points for sentences far from prose length, too few function words
                 (word lists, keyword stuffing) and fragments too short to carry an argument
    complexity   Guiraud's lexical richness (types / sqrt(tokens), length-robust unlike type/token),
                 nudged by mean word length
    helpfulness  number of distinct content words, capped by correctness and coherence (garbled text
                 teaches nothing however many words it has)
    verbosity    word count, plus one for heavy repetition (the rubric's "padded and repetitive")

code (0-10)
    readability  loses points for long lines, no comments, cryptic short names and deep nesting
    modularity   functions/classes present and of moderate size; module-level state costs points
    clarity      docstrings per unit, comment density and descriptive names
    reusability  defines units, annotates types, keeps no mutable globals or import-time side effects
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence

from moe_dag.data.oracle.base import LabelRequest, LabelResult, make_label
from moe_dag.data.oracle.rubrics import CODE, GENERAL, rubric_by_name

_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")
_STOPWORD_TEXT = (
    "a an and are as at be been but by can could did do does for from had has have he her his i if "
    "in into is it its may more most must no not of on one or our she should so some such than that "
    "the their them then there these they this those to was we were what when which while who will "
    "with would you your"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _bins(value: float, edges: Sequence[float]) -> int:
    """How many of the ascending `edges` `value` reaches."""
    return sum(value >= edge for edge in edges)


def _clamp(value: float, top: int) -> int:
    return int(min(top, max(0, round(value))))


def score_general(text: str) -> dict[str, int]:
    words = _WORD.findall(text)
    lower = [w.lower() for w in words]
    n_words = len(words)
    tokens = text.split()
    chars = [c for c in text if not c.isspace()]

    symbol_fraction = sum(not c.isalnum() for c in chars) / max(1, len(chars))
    wordy_token_fraction = sum(bool(_WORD.search(t)) for t in tokens) / max(1, len(tokens))
    trigrams = list(zip(lower, lower[1:], lower[2:], strict=False))
    repeated_trigrams = 1 - len(set(trigrams)) / len(trigrams) if trigrams else 0.0
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    repeated_lines = 1 - len(set(lines)) / len(lines) if lines else 0.0

    correctness = 4 - (
        _bins(symbol_fraction, (0.12, 0.25))
        + _bins(1 - wordy_token_fraction, (0.2, 0.5))
        + _bins(repeated_trigrams, (0.2, 0.5))
        + _bins(repeated_lines, (0.3,))
    )

    sentence_words = n_words / max(1, len(_SENTENCE_END.findall(text)))
    stopword_fraction = sum(w in _STOPWORDS for w in lower) / max(1, n_words)
    coherence = 4 - (
        (not 6 <= sentence_words <= 40)
        + (not 3 <= sentence_words <= 80)
        + _bins(-stopword_fraction, (-0.2, -0.1))
        + 2 * (n_words < 10)
    )

    guiraud = len(set(lower)) / math.sqrt(n_words) if n_words else 0.0
    mean_word_length = sum(map(len, words)) / max(1, n_words)
    complexity = _bins(guiraud, (4, 6, 8, 10)) + (mean_word_length >= 5.5) - (mean_word_length < 4)

    content_words = {w for w in lower if len(w) >= 4 and w not in _STOPWORDS}
    helpfulness = min(_bins(len(content_words), (5, 15, 40, 100)), correctness + 1, coherence + 1)

    verbosity = _bins(n_words, (30, 100, 400, 1200)) + (repeated_trigrams > 0.3)

    return {
        "helpfulness": _clamp(helpfulness, 4),
        "correctness": _clamp(correctness, 4),
        "coherence": _clamp(coherence, 4),
        "complexity": _clamp(complexity, 4),
        "verbosity": _clamp(verbosity, 4),
    }


_UNIT = re.compile(
    r"^\s*(?:async\s+def|def|class|function|func|fn|struct|interface|impl|"
    r"(?:public|private|protected)(?:\s+static)?\s+[\w<>\[\],]+\s+\w+\s*\()\b",
    re.MULTILINE,
)
_COMMENT = re.compile(r"^\s*(?:#|//|/\*|\*|--)")
_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_KEYWORD_TEXT = (
    "and as assert async await break case catch class const continue def del elif else except false "
    "finally fn for from func function if import in int is lambda let none not or pass public "
    "private protected raise return self static struct true try var void while with yield"
)
_KEYWORDS = frozenset(_KEYWORD_TEXT.split())
# Module-level lowercase assignments: mutable globals. ALL_CAPS constants are fine and not matched.
_GLOBAL_ASSIGN = re.compile(r"^(?:[a-z_][a-z0-9_]*(?:\s*,\s*[a-z_]\w*)*)\s*=(?!=)", re.MULTILINE)
_GLOBAL_KEYWORD = re.compile(r"^\s+global\s+\w", re.MULTILINE)
_TOP_LEVEL_CALL = re.compile(r"^[A-Za-z_][\w.]*\(", re.MULTILINE)


def score_code(text: str) -> dict[str, int]:
    lines = [line.rstrip() for line in text.splitlines()]
    code_lines = [line for line in lines if line.strip()]
    n_lines = max(1, len(code_lines))

    long_lines = sum(len(line) > 100 for line in code_lines) / n_lines
    mean_line_length = sum(map(len, code_lines)) / n_lines
    comments = sum(bool(_COMMENT.match(line)) for line in code_lines) / n_lines
    docstrings = (text.count('"""') + text.count("'''")) // 2 + text.count("/**")
    units = len(_UNIT.findall(text))
    indents = [len(line) - len(line.lstrip(" \t")) for line in code_lines]
    tab_width = 1 if any(line.startswith("\t") for line in code_lines) else 4
    max_depth = max(indents, default=0) / tab_width
    names = {n for n in _IDENTIFIER.findall(text) if n.lower() not in _KEYWORDS}
    short_names = sum(len(n) <= 2 for n in names) / max(1, len(names))
    global_state = len(_GLOBAL_ASSIGN.findall(text)) + len(_GLOBAL_KEYWORD.findall(text))
    guarded = "__main__" in text
    side_effects = len(_TOP_LEVEL_CALL.findall(text)) > 0 and not guarded
    defs = re.findall(r"^\s*(?:async\s+)?def\s.*$", text, re.MULTILINE)
    typed = sum("->" in d for d in defs) / len(defs) if defs else 0.0

    readability = (
        10
        - 4 * min(1.0, 4 * long_lines)
        - (mean_line_length > 80)
        - 2 * (comments == 0 and docstrings == 0 and n_lines > 10)
        - _bins(short_names, (0.3, 0.5)) * 1.5
        - 2 * (max_depth > 6)
    )

    if units == 0:
        modularity = 2 if n_lines <= 15 else 1
    else:
        lines_per_unit = n_lines / units
        modularity = max(3.0, 10 - max(0.0, lines_per_unit - 20) / 10) - 2 * (global_state > 3)

    clarity = (
        2 + 4 * min(1.0, docstrings / max(1, units)) + 2 * min(1.0, 10 * comments) + 2 * (1 - short_names)
    )

    reusability = (
        4 * (units > 0)
        + 2 * typed
        + (2 if global_state == 0 else 1 if global_state <= 2 else 0)
        + (not side_effects)
        + (docstrings > 0)
    )

    return {
        "readability": _clamp(readability, 10),
        "modularity": _clamp(modularity, 10),
        "clarity": _clamp(clarity, 10),
        "reusability": _clamp(reusability, 10),
    }


_SCORERS = {GENERAL.name: score_general, CODE.name: score_code}


class RuleBasedOracle:
    """Scores each request with the rules of its rubric; same input, same label, no model needed."""

    model_name = "rules-v1"

    def label(self, requests: Sequence[LabelRequest]) -> Iterator[LabelResult]:
        for request in requests:
            scores = _SCORERS[rubric_by_name(request.rubric).name](request.text)
            yield LabelResult(request, make_label(request, scores, self.model_name))
