"""Token ids of a document's first `max_tokens` tokens from a prefix of its text, not the whole of it.

A fast tokenizer asked to truncate still tokenises the whole text first, and pretraining documents run
to many kB. So each text is cut at the first space, preceded by a non-space, at or after
`CHARS_PER_TOKEN * max_tokens` characters; a prefix that comes out short of `max_tokens` tokens is
tokenised again whole. The ids and masks are those of the plain call, provided a cut never changes the
tokens before it, which holds for the tokenizers `prefix_chars` accepts (it returns None otherwise):

- Added tokens (special tokens found in the text) are split off first by literal match; none of them
  holds whitespace, so none spans the cut.
- The BERT normaliser maps each character on its own (control characters dropped, whitespace to a
  space, spaces around CJK ideographs, NFD and accent stripping, lowercasing); NFD's reordering only
  moves combining marks, which never cross a space. The byte-level tokenizers have no normaliser.
- The pre-tokenizer ends a pre-token at the cut. BERT's splits at every whitespace character. In the
  byte-level regexes (GPT-2's, Llama 3's, o200k's of gpt-oss) no alternative takes a space after a
  non-space (a space only starts a match or follows whitespace; `[\\r\\n/]*` after punctuation stops
  at it), and the one lookahead, `\\s+(?!\\S)`, only runs over whitespace: every match that starts
  before the cut sees a space there just as it would see the end of the text. (The cut looks behind for
  Python's whitespace, which holds all of Unicode's, so the regexes' too.)
- WordPiece and BPE encode each pre-token on its own, and truncation on the right keeps the first ones.

So the prefix's tokens are the first tokens of the whole text, and a prefix that gives `max_tokens` of
them (special tokens included) gives exactly the plain call's. tests/test_token_prefix.py checks this
on the stdlib's docs and sources, 22 languages' translations and text without any whitespace.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# On 1,200 demo documents (benchmarks/scoring.py's demo_documents, 400 a source) all-MiniLM-L6-v2's 127th
# token ends within 1,012 characters, 401 at the median. Tokenising's CPU time against whole texts, with
# the prefixes tokenised again: 0.38x at 4 characters a token (189), 0.29x at 5 (24), 0.33x at 6 (1),
# 0.39x at 8 (0). 6 leaves room for text with more characters a token than the demo's.
CHARS_PER_TOKEN = 6
_CUT = re.compile(r"(?<=\S) ")
# Llama 3's and gpt-oss's (o200k) pre-tokenizer regexes, as their tokenizer.json files spell them.
SPLIT_REGEXES = frozenset(
    {
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
)


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _cut_ends_pre_token(normalizer: dict | None, pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer["type"] == "BertPreTokenizer":
        return normalizer is None or normalizer["type"] == "BertNormalizer"
    if normalizer is not None:
        return False
    if pre_tokenizer["type"] == "ByteLevel":
        return pre_tokenizer["use_regex"]  # GPT-2's regex
    parts = pre_tokenizer.get("pretokenizers", [])
    return (
        pre_tokenizer["type"] == "Sequence"
        and len(parts) == 2
        and parts[0]["type"] == "Split"
        and parts[0]["pattern"].get("Regex") in SPLIT_REGEXES
        and parts[0]["behavior"] == "Isolated"
        and not parts[0]["invert"]
        and parts[1]["type"] == "ByteLevel"
        and not parts[1]["use_regex"]
    )


def prefix_chars(tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> int | None:
    """Characters from which texts may be cut for `tokenizer`, or None where a cut is not proven exact."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or tokenizer.truncation_side != "right":
        return None
    added = backend.get_added_tokens_decoder().values()
    if any(char.isspace() for token in added for char in token.content):
        return None
    if not _cut_ends_pre_token(_state(backend.normalizer), _state(backend.pre_tokenizer)):
        return None
    return CHARS_PER_TOKEN * max_tokens


def prefix_token_ids(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], max_tokens: int, chars: int | None
) -> list[list[int]]:
    """Each text's token ids cut to `max_tokens`, from its prefix where `chars` is set."""
    prefixes = texts if chars is None else [text_prefix(text, chars) for text in texts]
    ids = tokenizer(prefixes, truncation=True, max_length=max_tokens)["input_ids"]
    short = [i for i, row in enumerate(ids) if len(row) < max_tokens and len(prefixes[i]) < len(texts[i])]
    if short:
        whole = tokenizer([texts[i] for i in short], truncation=True, max_length=max_tokens)["input_ids"]
        for i, row in zip(short, whole, strict=True):
            ids[i] = row
    return ids


def text_prefix(text: str, chars: int) -> str:
    """`text` up to its first space after a non-space at or after `chars` characters; all of it if none."""
    cut = _CUT.search(text, chars) if len(text) > chars else None
    return text if cut is None else text[: cut.start()]
