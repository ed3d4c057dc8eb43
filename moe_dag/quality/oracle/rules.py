"""A deterministic rubric oracle computed from text statistics: the default where no LLM is available.

It answers in exactly the schema an LLM oracle does (the same rubrics, integer scores, validated), so the
rest of the pipeline runs unchanged on a laptop. The rules are coarse, but each score follows a
measurable property that the corresponding rubric dimension is about:

general text (0-4), from features that mean the same in every script: words (letters with their
combining marks; runs of scripts written without spaces, such as Chinese or Thai, cut into word-sized
pieces), any script's sentence terminators (。 । ۔ ։ ...; in Thai and Lao a space between phrases), and
letters against symbols by Unicode category. No English word list is used, so a translated paragraph
scores like its original (tests/test_oracle_languages.py).
    correctness  starts at 4, loses points for symbol soup, tokens with no letters and repeated n-grams
                 or lines (the signatures of boilerplate, spam and broken extraction)
    coherence    starts at 4, loses points for sentences far from prose length, words outside lines that
                 end a sentence (word lists, menus, keyword stuffing) and fragments too short to carry an
                 argument
    complexity   Guiraud's lexical richness (types / sqrt(tokens), length-robust unlike type/token)
    helpfulness  number of distinct content words (three letters or more), capped by correctness and
                 coherence (garbled text teaches nothing however many words it has)
    verbosity    word count, plus one for heavy repetition (the rubric's "padded and repetitive")

code (0-10)
    readability  loses points for long lines, no comments, cryptic short names and deep nesting
    modularity   functions/classes present and of moderate size; module-level state costs points
    clarity      docstrings per unit, comment density and descriptive names
    reusability  defines units, annotates types, keeps no mutable globals or import-time side effects
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Iterator, Sequence

from moe_dag.curation.filters.text import TERMINAL_PUNCTUATION
from moe_dag.quality.oracle.base import LabelRequest, LabelResult, make_label
from moe_dag.quality.oracle.rubrics import CODE, GENERAL, rubric_by_name

# Scripts written without spaces between words, and how many letters make about one word in each: a
# run of such letters is cut into pieces of that many letters (a combining mark stays with its letter),
# so it counts about as many units as the same text in a spaced script counts words. Measured on the
# translated paragraphs of tests/test_oracle_languages.py against the English one's 90 words: Chinese
# 149 characters, Japanese 182, Thai 363 letters (plus 132 marks).
_UNSPACED_WORD_LETTERS = {
    "CJK": 2,
    "HIRAGANA": 2,
    "KATAKANA": 2,
    "THAI": 4,
    "LAO": 4,
    "KHMER": 4,
    "MYANMAR": 4,
    "TIBETAN": 4,
}
# Scripts whose writing has no sentence terminator in common use: a space between two of their letters
# ends a phrase, the nearest thing to a sentence.
_UNTERMINATED_SCRIPTS = frozenset({"THAI", "LAO"})
_SENTENCE_TERMINATORS = frozenset(TERMINAL_PUNCTUATION)
_LETTER = r"[^\W\d_]"


@functools.cache
def _word_pattern() -> re.Pattern[str]:
    r"""A word: letters and the combining marks between them (Devanagari vowel signs, Arabic harakat, Thai
    tone marks are marks, not letters, and `\w` alone would cut every Hindi word at each of them), with
    at most one inner apostrophe."""
    marks = {c for c in range(0x300, 0x20000) if unicodedata.category(chr(c)).startswith("M")}
    starts = sorted(c for c in marks if c - 1 not in marks)
    ends = sorted(c for c in marks if c + 1 not in marks)
    mark_ranges = "".join(
        f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in zip(starts, ends, strict=True)
    )
    letter_or_mark = f"(?:{_LETTER}|[{mark_ranges}])"
    return re.compile(f"{_LETTER}{letter_or_mark}*(?:['\u2019]{_LETTER}{letter_or_mark}*)?")


@functools.cache
def _script(char: str) -> str:
    """The first word of the character's Unicode name: its script for letters ("LATIN", "CJK", "THAI")."""
    return unicodedata.name(char, "UNKNOWN").split(" ", 1)[0]


def _units(text: str) -> list[str]:
    """The text's words, lower-cased, with runs of unspaced scripts cut into word-sized pieces."""
    units = []
    for word in _word_pattern().findall(text):
        size = _UNSPACED_WORD_LETTERS.get(_script(word[0]))
        if size is None:
            units.append(word.lower())
            continue
        starts = [i for i, char in enumerate(word) if not unicodedata.category(char).startswith("M")]
        cuts = [*starts[::size], len(word)]
        units.extend(word[begin:end] for begin, end in zip(cuts, cuts[1:], strict=False))
    return units


def _sentence_ends(line: str) -> int:
    """Sentence ends in a line: runs of terminal punctuation (any script's: 。 । ۔ ։ ...) that end a
    word, or, in a script without terminators, a space between two of its letters."""
    ends = 0
    for i, char in enumerate(line):
        following = line[i + 1] if i + 1 < len(line) else " "
        if char in _SENTENCE_TERMINATORS:
            ends += following not in _SENTENCE_TERMINATORS and (following.isspace() or not char.isascii())
        elif char.isspace() and i > 0 and following.strip():
            ends += (
                _script(line[i - 1]) in _UNTERMINATED_SCRIPTS and _script(following) in _UNTERMINATED_SCRIPTS
            )
    return ends


def _bins(value: float, edges: Sequence[float]) -> int:
    """How many of the ascending `edges` `value` reaches."""
    return sum(value >= edge for edge in edges)


def _clamp(value: float, top: int) -> int:
    return int(min(top, max(0, round(value))))


def score_general(text: str) -> dict[str, int]:
    """The general rubric's scores from features that mean the same in every script: words (or
    word-sized pieces of unspaced scripts), any script's sentence ends, letters with their marks."""
    units = _units(text)
    n_units = len(units)
    tokens = text.split()
    chars = [c for c in text if not c.isspace()]

    symbol_fraction = sum(unicodedata.category(c)[0] not in "LMN" for c in chars) / max(1, len(chars))
    wordy_token_fraction = sum(bool(_word_pattern().search(t)) for t in tokens) / max(1, len(tokens))
    trigrams = list(zip(units, units[1:], units[2:], strict=False))
    repeated_trigrams = 1 - len(set(trigrams)) / len(trigrams) if trigrams else 0.0
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    repeated_lines = 1 - len(set(lines)) / len(lines) if lines else 0.0

    correctness = 4 - (
        _bins(symbol_fraction, (0.12, 0.25))
        + _bins(1 - wordy_token_fraction, (0.2, 0.5))
        + _bins(repeated_trigrams, (0.2, 0.5))
        + _bins(repeated_lines, (0.3,))
    )

    # Prose is written in sentences: word lists, menus and keyword stuffing are lines without a sentence
    # end (the share counts words, so a short heading above paragraphs costs little).
    line_units = [(len(_units(line)), _sentence_ends(line)) for line in lines]
    sentences = sum(ends for _, ends in line_units)
    prose_share = sum(n for n, ends in line_units if ends) / max(1, n_units)
    sentence_words = n_units / max(1, sentences)
    coherence = 4 - (
        (not 6 <= sentence_words <= 40)
        + (not 3 <= sentence_words <= 80)
        + _bins(-prose_share, (-0.5, -0.2))
        + 2 * (n_units < 10)
    )

    # Guiraud's lexical richness: types / sqrt(tokens), robust to length unlike type/token.
    guiraud = len(set(units)) / math.sqrt(n_units) if n_units else 0.0
    complexity = _bins(guiraud, (4, 6, 8, 10))

    # Content words: distinct units of three letters or more (marks not counted), or unspaced pieces.
    content_words = {u for u in units if len(u) >= 3 or _script(u[0]) in _UNSPACED_WORD_LETTERS}
    helpfulness = min(_bins(len(content_words), (5, 15, 40, 100)), correctness + 1, coherence + 1)

    verbosity = _bins(n_units, (30, 100, 400, 1200)) + (repeated_trigrams > 0.3)

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

    # v2: words, sentences and symbols in every script (v1 read Latin-script English only).
    model_name = "rules-v2"

    def label(self, requests: Sequence[LabelRequest]) -> Iterator[LabelResult]:
        for request in requests:
            scores = _SCORERS[rubric_by_name(request.rubric).name](request.text)
            yield LabelResult(request, make_label(request, scores, self.model_name))
