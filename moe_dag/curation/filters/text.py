"""How the reference filters cut text into words and sentences, reproduced fast.

datatrove (0.10) splits English text into words with spaCy's English tokenizer (`spacy.blank("en")`):
text is cut at whitespace, then each chunk loses leading and trailing punctuation one piece at a time
(prefixes and suffixes), known exceptions are split as listed ("don't" -> "do" + "n't", "U.S." stays),
URLs stay whole, and what remains is cut at infixes (hyphens between letters, "/" between words, ...).
C4 counts sentences with spaCy's `Sentencizer`: a sentence ends after a token that is sentence
punctuation, at the next token that is not punctuation.

`split_words` runs that algorithm (spaCy's `Tokenizer._split_affixes` and `_attach_tokens`) over spaCy's
own tables (`spacy_english.py`), in Python, and remembers each whitespace chunk it has split: text repeats
its words, so most chunks cost one dictionary look-up, and plain alphanumeric chunks skip the regexes.
That is what makes it several times faster than spaCy building a `Doc` for the same text. spaCy's last
pass, which re-applies special cases spanning several affix tokens, is left out: it changes a few
emoticons and abbreviations inside punctuation, not the rules' decisions (see the comparison test).

The punctuation tables are datatrove's (`datatrove/utils/text.py`, Apache-2.0): terminal punctuation is
Unicode's Sentence_Terminal set, so the Urdu (U+06D4) and Armenian (U+0589) full stops count.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from moe_dag.curation.filters import spacy_english


@dataclass(kw_only=True)
class ScriptRules:
    """How the rule families read text in any script; shared by them, owned by none.

    `per_script` (reference off): letters of scripts written without spaces (Chinese, Japanese, Thai,
    Lao, Khmer, Myanmar, Tibetan) count as words; sentences end at every script's terminator (。！？।۔։
    ...), not only at spaCy's English ones, and at a full stop spaCy leaves attached (after a Malayalam
    sign, a Georgian letter); a space between two letters of an unspaced script ends a sentence (Thai
    and Lao have no terminator; Chinese and Japanese put no space inside one). English text is split
    exactly as datatrove splits it either way (on the 1,127 installed English documents every family
    decides the same with and without it).
    `line_rules_min_lines` (reference 1): rules that take a fraction of lines (bullets, ellipses,
    punctuated and short lines) need this many lines; a one-line text scores only 0 or 1 on them.
    """

    per_script: bool = True
    line_rules_min_lines: int = 2

    def __post_init__(self) -> None:
        if self.line_rules_min_lines < 1:
            raise ValueError(f"line_rules_min_lines must be >= 1, got {self.line_rules_min_lines}")


# Unicode Sentence_Terminal characters, datatrove's TERMINAL_PUNCTUATION.
TERMINAL_PUNCTUATION: tuple[str, ...] = tuple(
    "!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d"
    "\u083e\u0964\u0965\u104a\u104b\u1362\u1367\u1368\u166e\u1735\u1736\u17d4"
    "\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa\u1aab"
    "\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u203c\u203d"
    "\u2047\u2048\u2049\u2e2e\u2e3c\u2e53\u2e54\u3002\ua4ff\ua60e\ua60f\ua6f3"
    "\ua6f7\ua876\ua877\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0"
    "\uaaf1\uabeb\ufe52\ufe56\ufe57\uff01\uff0e\uff1f\uff61\U00010a56\U00010a57"
    "\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86\U00010f87\U00010f88"
    "\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1\U00011141"
    "\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238"
    "\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3"
    "\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0"
    "\U000115d1\U000115d2\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7\U00011641"
    "\U00011642\U0001173c\U0001173d\U0001173e\U00011944\U00011946\U00011a42\U00011a43"
    "\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7\U00011ef8\U00011f43\U00011f44"
    "\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44\U00016e98\U0001bc9f"
    "\U0001da88"
)
# datatrove's PUNCTUATION_SET: ASCII and CJK punctuation, control characters, and the terminal set.
PUNCTUATION_SET: frozenset[str] = frozenset(
    "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\r\x0e\x0f\x10\x11\x12\x13\x14"
    "\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f!\"#$%&'()*+,-./:;<=>?@[\\]^"
    "_`{|}~\x7f\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f"
    "\x90\x91\x92\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f\xab\xb4"
    "\xbb\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d"
    "\u083e\u0964\u0965\u104a\u104b\u1362\u1367\u1368\u166e\u1735\u1736\u17d4"
    "\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa\u1aab"
    "\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u2013\u2014"
    "\u2019\u201c\u201d\u201e\u2026\u203c\u203d\u2047\u2048\u2049\u2236\u2501"
    "\u25ba\u2e2e\u2e3c\u2e53\u2e54\u3001\u3002\u3008\u3009\u300a\u300b\u300c"
    "\u300d\u3010\u3011\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877\ua8ce\ua8cf"
    "\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0\uaaf1\uabeb\ufe52\ufe56\ufe57"
    "\uff01\uff05\uff08\uff09\uff0c\uff0e\uff11\uff1a\uff1b\uff1f\uff5e\uff61"
    "\U00010a56\U00010a57\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86"
    "\U00010f87\U00010f88\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0"
    "\U000110c1\U00011141\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de"
    "\U000111df\U00011238\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c"
    "\U000115c2\U000115c3\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce"
    "\U000115cf\U000115d0\U000115d1\U000115d2\U000115d3\U000115d4\U000115d5\U000115d6"
    "\U000115d7\U00011641\U00011642\U0001173c\U0001173d\U0001173e\U00011944\U00011946"
    "\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7\U00011ef8"
    "\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44"
    "\U00016e98\U0001bc9f\U0001da88"
) | frozenset(TERMINAL_PUNCTUATION)

# Scripts written without spaces between words: one whitespace "word" can be a whole sentence.
_UNSPACED_LETTER = re.compile(
    "[\u0e00-\u0e7f\u0e80-\u0eff\u1000-\u109f\u1780-\u17ff\u0f00-\u0fff"
    "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)
_LETTER = re.compile(r"[^\W\d_]")
# Thai and Lao have no sentence terminator: a space ends a sentence or clause, a letter ends a line.
_SPACE_SEPARATED = re.compile("[\u0e00-\u0e7f\u0e80-\u0eff]")
# A space between two letters of an unspaced script: where a sentence ends.
_UNSPACED_BREAK = re.compile(f"({_UNSPACED_LETTER.pattern})\\s+(?={_UNSPACED_LETTER.pattern})")
_TERMINAL_SET = frozenset(TERMINAL_PUNCTUATION)

_PREFIX = re.compile(spacy_english.PREFIX)
_SUFFIX = re.compile(spacy_english.SUFFIX)
_INFIX = re.compile(spacy_english.INFIX)
_URL = re.compile(spacy_english.URL)
_SPECIAL = spacy_english.SPECIAL_CASES
_MAX_CACHED_CHUNKS = 500_000


# `run_filters` runs every filter over one chunk of documents before the next, so a cache the size of a
# chunk lets the Gopher and FineWeb families split each document once.
@functools.lru_cache(maxsize=1024)
def split_words(text: str) -> tuple[str, ...]:
    """spaCy English tokens of `text` without whitespace tokens (datatrove's `split_into_words`)."""
    words: list[str] = []
    for chunk in text.split():
        words.extend(_chunk_tokens(chunk))
    return tuple(words)


_CHUNK_CACHE: dict[str, tuple[str, ...]] = {}


def _chunk_tokens(chunk: str) -> tuple[str, ...]:
    """`_split_chunk`, remembered: text repeats its words."""
    pieces = _CHUNK_CACHE.get(chunk)
    if pieces is None:
        pieces = _split_chunk(chunk)
        if len(_CHUNK_CACHE) >= _MAX_CACHED_CHUNKS:
            _CHUNK_CACHE.clear()
        _CHUNK_CACHE[chunk] = pieces
    return pieces


def _split_chunk(chunk: str) -> tuple[str, ...]:
    """One whitespace-free chunk in spaCy tokens."""
    special = _SPECIAL.get(chunk)
    if special is not None:
        return special
    if chunk.isalpha():
        return (chunk,)  # no prefix, suffix or infix rule matches letters alone
    return _merge_affix_specials(_split_affixes_and_infixes(chunk, _SPECIAL))


def _split_affixes_and_infixes(chunk: str, special: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """spaCy's `_tokenize_affixes` for one chunk, with the special cases `special`."""
    prefixes, core, suffixes = _split_affixes(chunk, special)
    tokens = list(prefixes)
    if core:
        if core in special:
            tokens.extend(special[core])
        elif _URL.match(core):
            tokens.append(core)
        else:
            tokens.extend(_split_infixes(core))
    tokens.extend(reversed(suffixes))
    return tuple(tokens)


def _merge_affix_specials(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """spaCy's `_apply_special_cases`: special cases that the affix rules split ("):", "''") are rejoined."""
    if len(tokens) < 2 or not any(token in _AFFIX_SPECIALS for token in tokens):
        return tokens
    merged: list[str] = []
    i = 0
    while i < len(tokens):
        for pattern, orths in _AFFIX_SPECIALS.get(tokens[i], ()):
            if tokens[i : i + len(pattern)] == pattern:
                merged.extend(orths)
                i += len(pattern)
                break
        else:
            merged.append(tokens[i])
            i += 1
    return tuple(merged)


def _split_affixes(string: str, special: dict[str, tuple[str, ...]]) -> tuple[list[str], str, list[str]]:
    """spaCy's `Tokenizer._split_affixes`: strip prefixes and suffixes until a special case or nothing."""
    _SPECIAL = special  # noqa: N806 - the loop below reads as spaCy's
    prefixes: list[str] = []
    suffixes: list[str] = []
    last_size = -1
    while string and len(string) != last_size:
        if string in _SPECIAL:
            break
        last_size = len(string)
        match = _PREFIX.match(string)  # the pattern is anchored at the start: match is search
        pre_len = match.end() if match else 0
        if pre_len:
            prefix, minus_pre = string[:pre_len], string[pre_len:]
            if minus_pre and minus_pre in _SPECIAL:
                prefixes.append(prefix)
                string = minus_pre
                break
        suf_len = _suffix_length(string[pre_len:])
        if suf_len:
            suffix, minus_suf = string[-suf_len:], string[:-suf_len]
            if minus_suf and minus_suf in _SPECIAL:
                suffixes.append(suffix)
                string = minus_suf
                break
        if pre_len and suf_len and pre_len + suf_len <= len(string):
            prefixes.append(prefix)
            suffixes.append(suffix)
            string = string[pre_len:-suf_len]
        elif pre_len:
            prefixes.append(prefix)
            string = minus_pre
        elif suf_len:
            suffixes.append(suffix)
            string = minus_suf
        if string in _SPECIAL:
            break
    return prefixes, string, suffixes


def _suffix_length(string: str) -> int:
    """Length of spaCy's suffix match at the end of `string`, 0 if none.

    The pattern is anchored at the end, and a plain search tries it at every position of the string;
    suffixes are short, so the search starts near the end (lookbehinds still see the characters before)
    and is repeated from the start only when the match could extend further left.
    """
    start = max(len(string) - _SUFFIX_WINDOW, 0)
    match = _SUFFIX.search(string, start)
    if match and start and match.start() == start:
        match = _SUFFIX.search(string)
    return match.end() - match.start() if match else 0


_SUFFIX_WINDOW = 24


def _split_infixes(string: str) -> list[str]:
    """spaCy's infix step of `Tokenizer._attach_tokens`."""
    tokens: list[str] = []
    start = 0
    for match in _INFIX.finditer(string):
        infix_start, infix_end = match.start(), match.end()
        if infix_start == 0:
            continue
        if infix_start != start:
            tokens.append(string[start:infix_start])
        if infix_start != infix_end:
            tokens.append(string[infix_start:infix_end])
        start = infix_end
    if string[start:]:
        tokens.append(string[start:])
    return tokens


def _affix_specials() -> dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]]:
    """Special cases the affix rules split, by their first piece, longest first."""
    table: dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for string, orths in _SPECIAL.items():
        pieces = _split_affixes_and_infixes(string, {})
        if len(pieces) > 1:
            table.setdefault(pieces[0], []).append((pieces, orths))
    for patterns in table.values():
        patterns.sort(key=lambda pattern: -len(pattern[0]))
    return table


_AFFIX_SPECIALS = _affix_specials()


def is_punctuation(token: str) -> bool:
    """spaCy's `is_punct`: every character is in a Unicode punctuation category."""
    return all(unicodedata.category(ch).startswith("P") for ch in token)


def count_sentences(text: str, enough: int) -> int:
    """Sentences spaCy's `Sentencizer` finds in `text`, counting no further than `enough`."""
    tokens = _tokens_with_whitespace(text)
    if not tokens:
        return 0
    sentences, seen_end = 1, False
    for token in tokens:
        is_end = token in spacy_english.SENTENCE_PUNCTUATION
        if seen_end and not is_end and not is_punctuation(token):
            sentences += 1
            seen_end = False
            if sentences >= enough:
                break
        elif is_end:
            seen_end = True
    return sentences


def count_sentences_any_script(text: str, enough: int) -> int:
    """Sentences in `text` in any script, counting no further than `enough`.

    Text without a terminator outside ASCII ("." "!" "?") and no unspaced letters is English-like and
    counted as spaCy counts it (`count_sentences`). Otherwise a sentence is a run of text up to a run of
    terminal punctuation (Unicode's Sentence_Terminal set: 。！？।۔։ ...), plus trailing text without
    one; and in scripts written without spaces between words, a space between two of their letters ends
    a sentence too: Thai and Lao have no terminator and end sentences with a space, and Chinese and
    Japanese writers put no space inside a sentence.
    """
    if not _needs_script_rules(text):
        return count_sentences(text, enough)
    sentences, in_sentence = 0, False
    for ch in _UNSPACED_BREAK.sub("\\1\u3002", text):
        if ch in _TERMINAL_SET:
            if in_sentence:
                sentences += 1
                in_sentence = False
                if sentences >= enough:
                    return sentences
        elif not ch.isspace() and not is_punctuation(ch):
            in_sentence = True
    return min(sentences + in_sentence, enough)


def ends_sentence_any_script(line: str) -> bool:
    """Whether `line` ends as a sentence does in its script: in a terminal mark of any script (also
    before a closing CJK quote or bracket: 。」), or in Thai and Lao, which have none, in a letter."""
    if line.endswith(TERMINAL_PUNCTUATION):
        return True
    closed = line.rstrip("\u300d\u300f\uff09")
    if closed != line and closed.endswith(TERMINAL_PUNCTUATION):
        return True
    return bool(line) and bool(_SPACE_SEPARATED.match(line[-1]))


def _needs_script_rules(text: str) -> bool:
    """Whether `text` has a terminator outside ASCII, letters of an unspaced script, or a full stop that
    spaCy's English rules leave attached (after a Malayalam sign or a Georgian letter, say)."""
    if any(ch in _TERMINAL_SET and ch not in ".!?" for ch in text) or _UNSPACED_LETTER.search(text):
        return True
    return any(
        unicodedata.category(match[1])[0] in "LM" and not _period_splits_after(match[1])
        for match in _NON_ASCII_BEFORE_PERIOD.finditer(text)
    )


_NON_ASCII_BEFORE_PERIOD = re.compile(r"([^\x00-\x7f\s])[.!?]")


@functools.lru_cache(maxsize=4096)
def _period_splits_after(ch: str) -> bool:
    """Whether spaCy's English suffix rules cut a full stop off a word ending in `ch`."""
    return _split_chunk("a" + ch + ".")[-1] == "."


def _tokens_with_whitespace(text: str) -> list[str]:
    """spaCy's tokens of `text`, with " " for each whitespace token it keeps (a run other than one space)."""
    tokens: list[str] = []
    for chunk, space in _CHUNKS.findall(text):
        if chunk:
            tokens.extend(_chunk_tokens(chunk))
        if space and space != " ":
            tokens.append(" ")
    return tokens


_CHUNKS = re.compile(r"(\S*)(\s*)")


def unspaced_letter_count(text: str) -> int:
    """Letters of scripts written without spaces between words (Chinese, Japanese, Thai, ...)."""
    return len(_UNSPACED_LETTER.findall(text))


def mostly_unspaced(text: str) -> bool:
    """Whether most of `text`'s letters belong to scripts written without spaces."""
    unspaced = unspaced_letter_count(text)
    return unspaced > 0 and unspaced * 2 > len(_LETTER.findall(text))


def approximate_word_count(text: str) -> int:
    """Whitespace words, with every letter of an unspaced script counted as a word of its own."""
    return len(text.split()) + unspaced_letter_count(text)


def duplicates(elements: list[str]) -> tuple[int, int]:
    """How many of `elements` equal an earlier one, and the characters those repeats hold."""
    seen: set[str] = set()
    repeats, repeat_chars = 0, 0
    for element in elements:
        if element in seen:
            repeats += 1
            repeat_chars += len(element)
        else:
            seen.add(element)
    return repeats, repeat_chars
