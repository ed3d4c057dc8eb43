"""Documents to hashed word n-grams (shingles), vectorised over an Arrow batch of texts.

Normalisation (`normalize_text` is the readable definition): lowercase, and every run of characters
that are not letters, digits or combining marks separates two words, so punctuation, symbols,
underscores and spacing are not edits. In scripts written without spaces between words (Han, Hiragana,
Katakana, Thai, Lao, Khmer, Myanmar, Tibetan) each character is a word of its own, so a word n-gram
there is a character n-gram: the run between two punctuation marks is a whole clause, and one changed
character made every shingle of the clause new (issue 20: word 5-gram Jaccard 0.29 for a one-character
edit of a Chinese paragraph, against 0.87 for a one-word edit in English). Text without those scripts,
English among it, is split exactly as before, so its shingles and stored signatures stay the same. A
document becomes the hashes of its word n-grams; one shorter than n words is a single shingle of all
its words (an empty one, of none).

`shingle_hashes` computes exactly those words without a Python loop over words or shingles, which is
where a per-document implementation spends its time:
1. Arrow lowercases the batch; only documents with non-ASCII characters go through regular
   expressions (RE2), which turn non-ASCII separators (dashes, quotes, CJK punctuation) into spaces and
   put spaces around each character of an unspaced script; step 2 treats every ASCII byte that is not a
   letter or digit as a separator.
2. numpy classifies the batch's UTF-8 bytes (a-z, 0-9 and every byte of a multi-byte character are
   word bytes) and finds where words start and end; the word bytes, packed together, become one Arrow
   string array of words.
3. Arrow dictionary-encodes the words; only the distinct words are hashed (64-bit xxh3), a few
   thousand per batch, and gathered back.
4. The n word hashes of each window are combined (a different odd multiplier per position, so order
   matters) and finalised with the MurmurHash3 mixer, one numpy pass per position.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

# Non-ASCII characters that are not letters, digits or combining marks (RE2 syntax). ASCII separators
# are left to the byte classification, so the regex rewrites only the rare non-ASCII punctuation.
_NON_ASCII_SEPARATOR = r"[^\x00-\x7f\p{L}\p{N}\p{M}]+"
# A character of a script written without spaces between words: each is a word of its own.
_UNSPACED_CHARACTER = r"([\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Tibetan}])"
MAX_NGRAM_SIZE = 16
# Odd 64-bit multipliers, one per position in the window.
_POSITION_MULTIPLIERS = np.array(
    [(0x9E3779B97F4A7C15 * (2 * i + 1)) & 0xFFFF_FFFF_FFFF_FFFF for i in range(MAX_NGRAM_SIZE)],
    dtype=np.uint64,
)
_EMPTY_WINDOW = np.uint64(0x2545F4914F6CDD1D)  # what an absent word contributes (short documents)


@dataclass(frozen=True)
class Shingles:
    """The shingle hashes of a batch: document i owns hashes[offsets[i] : offsets[i + 1]] (never empty)."""

    hashes: np.ndarray  # uint64, may repeat within a document
    offsets: np.ndarray  # uint64, one more than documents
    content_hashes: list[str]  # 128-bit hex digest of each document's normalised words: exact duplicates


def normalize_text(text: str) -> str:
    """Lowercase, separators removed, words joined by one space: the definition `shingle_hashes` follows."""
    # Arrow's case mapping and RE2's scripts, as `shingle_hashes`.
    lowered = pc.replace_substring_regex(pc.utf8_lower(pa.array([text])), _UNSPACED_CHARACTER, r" \1 ")
    kept = (c if unicodedata.category(c)[0] in "LNM" else " " for c in lowered[0].as_py())
    return " ".join("".join(kept).split())


def shingle_hashes(texts: pa.Array | pa.ChunkedArray, ngram_size: int) -> Shingles:
    """Shingle hashes and content hashes of every text in the batch."""
    if not 1 <= ngram_size <= MAX_NGRAM_SIZE:
        raise ValueError(f"ngram_size must lie in [1, {MAX_NGRAM_SIZE}], got {ngram_size}")
    words, words_per_doc = _words(texts)
    word_hashes = _distinct_hashed(words)
    doc_word_offsets = np.concatenate([[0], np.cumsum(words_per_doc)])
    content_hashes = [
        xxhash.xxh3_128_hexdigest(word_hashes[start:end].tobytes())
        for start, end in zip(doc_word_offsets[:-1], doc_word_offsets[1:], strict=True)
    ]
    hashes, shingles_per_doc = _windows(word_hashes, words_per_doc, ngram_size)
    offsets = np.concatenate([[0], np.cumsum(shingles_per_doc)]).astype(np.uint64)
    return Shingles(hashes=hashes, offsets=offsets, content_hashes=content_hashes)


def _words(texts: pa.Array | pa.ChunkedArray) -> tuple[pa.StringArray, np.ndarray]:
    """Every word of the batch in order, and how many each document has."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    texts = pc.utf8_lower(texts.cast(pa.string()).fill_null(""))
    non_ascii = pc.invert(pc.string_is_ascii(texts))
    if pc.any(non_ascii).as_py():
        rewritten = pc.replace_substring_regex(texts.filter(non_ascii), _NON_ASCII_SEPARATOR, " ")
        rewritten = pc.replace_substring_regex(rewritten, _UNSPACED_CHARACTER, r" \1 ")
        texts = pc.replace_with_mask(texts, non_ascii, rewritten)
    offsets = np.frombuffer(texts.buffers()[1], np.int32)[texts.offset : texts.offset + len(texts) + 1]
    data = np.frombuffer(texts.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]

    is_word = _word_bytes(data)
    boundary = np.ones(len(data) + 1, dtype=bool)  # True where a word cannot continue across
    boundary[1:-1] = ~is_word[:-1]
    boundary[offsets] = True  # a document's first byte never continues the previous document's word
    starts = np.flatnonzero(is_word & boundary[:-1])
    after = np.append(~is_word[1:], True)
    after[offsets[1:] - 1] = True  # a document's last byte ends its word
    ends = np.flatnonzero(is_word & after) + 1
    packed_offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int32)
    packed = data[is_word]
    words = pa.StringArray.from_buffers(len(starts), pa.py_buffer(packed_offsets), pa.py_buffer(packed))
    return words, np.diff(np.searchsorted(starts, offsets))


def _word_bytes(data: np.ndarray) -> np.ndarray:
    """Which bytes belong to a word once the text is lowercased: a-z, 0-9, and any byte >= 0x80 (every
    byte of a multi-byte UTF-8 character; the regex has already replaced non-ASCII separators by spaces).
    Three comparisons, each a range test by unsigned wrap-around, take a third of a 256-entry table
    lookup's time."""
    with np.errstate(over="ignore"):
        return ((data - np.uint8(ord("a"))) < 26) | ((data - np.uint8(ord("0"))) < 10) | (data >= 0x80)


def _distinct_hashed(words: pa.StringArray) -> np.ndarray:
    """xxh3-64 of each word, hashing every distinct word once."""
    encoded = pc.dictionary_encode(words)
    distinct = encoded.dictionary.to_pylist()
    hashed = np.fromiter((xxhash.xxh3_64_intdigest(w.encode()) for w in distinct), np.uint64, len(distinct))
    return hashed[encoded.indices.to_numpy(zero_copy_only=False)]


def _windows(word_hashes: np.ndarray, words_per_doc: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One hash per window of n consecutive words of a document; one window for a shorter document."""
    word_start = np.concatenate([[0], np.cumsum(words_per_doc)])
    shingles_per_doc = np.maximum(words_per_doc - n + 1, 1)
    shingle_start = np.concatenate([[0], np.cumsum(shingles_per_doc)])
    doc = np.repeat(np.arange(len(words_per_doc)), shingles_per_doc)
    first_word = word_start[doc] + np.arange(len(doc)) - shingle_start[doc]
    padded = np.append(word_hashes, np.full(n, _EMPTY_WINDOW))
    with np.errstate(over="ignore"):
        # The window at every word of the batch, read from contiguous slices; windows that run into
        # the next document are computed too, and only picked for the short documents fixed below.
        windows = np.zeros(len(word_hashes) + 1, dtype=np.uint64)
        for position in range(n):
            windows += padded[position : position + len(windows)] * _POSITION_MULTIPLIERS[position]
        hashes = windows[first_word]
        short = np.flatnonzero(words_per_doc < n)  # their one window must not read the next document
        short_windows = np.zeros(len(short), dtype=np.uint64)
        for position in range(n):
            word = padded[word_start[short] + position]
            short_windows += (
                np.where(position < words_per_doc[short], word, _EMPTY_WINDOW)
                * (_POSITION_MULTIPLIERS[position])
            )
        hashes[shingle_start[short]] = short_windows
        return _fmix64(hashes), shingles_per_doc


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser: every input bit affects every output bit."""
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x
