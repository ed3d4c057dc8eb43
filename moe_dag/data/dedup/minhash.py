"""MinHash signatures for near-duplicate detection (Broder 1997), the first of the dedup stages.

Stages, each an Arrow table you can inspect: `compute_signatures` (this module) -> `find_duplicate_clusters`
-> `apply_dedup` (clusters.py).

The maths. A document becomes the set S of hashes of its word 5-grams (shingles) after normalisation.
For a random hash function h, P[min h(S1) = min h(S2)] = |S1 & S2| / |S1 | S2| = J, the Jaccard
similarity. A signature holds K = b * r such minima under independent hash functions, so the fraction
of equal positions estimates J with standard error sqrt(J (1 - J) / K) (0.038 at J = 0.8, K = 112).

Locality-sensitive hashing splits the K rows into b bands of r rows. Two documents become a candidate
pair when all r rows of at least one band agree:
    P(candidate | J = s) = 1 - (1 - s^r)^b
With b = 14 bands of r = 8 rows this S-curve crosses 0.5 at s = (1 - 0.5^(1/b))^(1/r) = 0.68 and gives
    s = 0.5 -> 0.053,  s = 0.7 -> 0.56,  s = 0.8 -> 0.92,  s = 0.9 -> 0.9996,
so pairs above the 0.8 verification threshold are found 92% to 100% of the time while pairs below 0.5
rarely cost a comparison. Candidates are then verified on the estimated J.

Hash functions: universal hashing h(x) = (a x + b) mod p over the prime p = 2^32 - 5, with
x the 64-bit xxhash of a shingle reduced modulo p. With a, b, x < p every product fits in 64 bits, so
numpy computes it exactly on uint64 (the usual p = 2^61 - 1 overflows and silently wraps), and each
minimum fits a uint32.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash
from tqdm.auto import tqdm

_PRIME = np.uint64(4_294_967_291)  # 2^32 - 5, the largest prime below 2^32
_NOT_WORD = re.compile(r"[\W_]+")  # punctuation, symbols and underscores; \w keeps letters of any script
# Documents hashed together in one matrix; bounds memory at about this many shingles x K x 8 bytes.
_SHINGLES_PER_BATCH = 16_384

SIGNATURE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("signature", pa.list_(pa.uint32()), nullable=False),
    ]
)


@dataclass(kw_only=True)
class MinHashConfig:
    num_bands: int = 14
    rows_per_band: int = 8
    ngram_size: int = 5
    seed: int = 1
    jaccard_threshold: float = 0.8

    def __post_init__(self) -> None:
        for name in ("num_bands", "rows_per_band", "ngram_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"MinHashConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.jaccard_threshold <= 1.0:
            raise ValueError(
                f"MinHashConfig.jaccard_threshold must lie in (0, 1], got {self.jaccard_threshold}"
            )

    @property
    def num_hashes(self) -> int:
        return self.num_bands * self.rows_per_band


def candidate_probability(similarity: float, num_bands: int, rows_per_band: int) -> float:
    """P(two documents with Jaccard `similarity` share at least one band bucket) = 1 - (1 - s^r)^b."""
    return 1.0 - (1.0 - similarity**rows_per_band) ** num_bands


def normalize_text(text: str) -> str:
    """Lowercase, punctuation removed, whitespace collapsed: edits in formatting alone are not edits."""
    return " ".join(_NOT_WORD.sub(" ", text.lower()).split())


def shingle_hashes(normalized: str, ngram_size: int) -> np.ndarray:
    """Distinct 64-bit hashes of the word n-grams; a text shorter than n words is one shingle."""
    words = normalized.split(" ")
    if len(words) <= ngram_size:
        shingles = [normalized]
    else:
        shingles = [" ".join(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    return np.unique(
        np.fromiter((xxhash.xxh3_64_intdigest(s.encode()) for s in shingles), np.uint64, len(shingles))
    )


def compute_signatures(table: pa.Table, config: MinHashConfig) -> pa.Table:
    """One row per document: id, source, content_hash (exact dedup) and its MinHash signature."""
    missing = {"id", "source", "text"} - set(table.column_names)
    if missing:
        raise ValueError(f"compute_signatures: the table lacks columns {sorted(missing)}")
    a, b = _hash_parameters(config)
    normalized = [normalize_text(text) for text in table["text"].to_pylist()]
    # 128 bits: at 10^9 documents a 64-bit hash would merge two different texts with probability ~3%.
    content_hash = [xxhash.xxh3_128_hexdigest(text.encode()) for text in normalized]

    signatures = np.empty((len(normalized), config.num_hashes), dtype=np.uint32)
    batch: list[np.ndarray] = []
    batch_start, batch_shingles = 0, 0
    for i, text in enumerate(tqdm(normalized, desc="minhash", unit="doc", disable=None)):
        batch.append(shingle_hashes(text, config.ngram_size))
        batch_shingles += len(batch[-1])
        if batch_shingles >= _SHINGLES_PER_BATCH or i == len(normalized) - 1:
            signatures[batch_start : i + 1] = _min_hashes(batch, a, b)
            batch, batch_start, batch_shingles = [], i + 1, 0

    flat = pa.array(signatures.reshape(-1), pa.uint32())
    offsets = pa.array(np.arange(len(normalized) + 1, dtype=np.int32) * config.num_hashes, pa.int32())
    return pa.table(
        [
            table["id"],
            table["source"],
            pa.array(content_hash, pa.string()),
            pa.ListArray.from_arrays(offsets, flat),
        ],
        schema=SIGNATURE_SCHEMA,
    )


def _hash_parameters(config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """The K pairs (a, b) with 1 <= a < p and 0 <= b < p, fixed by the seed."""
    rng = np.random.default_rng(config.seed)
    a = rng.integers(1, int(_PRIME), size=config.num_hashes, dtype=np.uint64)
    b = rng.integers(0, int(_PRIME), size=config.num_hashes, dtype=np.uint64)
    return a, b


def _min_hashes(shingles: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Signatures of a batch of documents: per document, the column minima of (a x + b) mod p."""
    x = np.concatenate(shingles) % _PRIME
    hashed = (x[:, None] * a[None, :] + b[None, :]) % _PRIME
    starts = np.cumsum([0] + [len(s) for s in shingles[:-1]])
    # Every document has at least one shingle, so no segment of reduceat is empty.
    return np.minimum.reduceat(hashed, starts, axis=0).astype(np.uint32)
