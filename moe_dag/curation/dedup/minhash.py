"""MinHash signatures for near-duplicate detection (Broder 1997), the first of the dedup stages.

Stages, each an Arrow table or parquet files you can inspect: `compute_signatures` (this module, one
batch at a time, per shard) -> `find_duplicate_clusters` (clusters.py, over the signature files of
every source) -> `apply_dedup` (per source).

The maths. A document becomes the set S of hashes of its word 5-grams (shingles.py). For a random
permutation h, P[min h(S1) = min h(S2)] = |S1 & S2| / |S1 | S2| = J, the Jaccard similarity. A
signature holds K = b * r such minima under independent permutations, so the fraction of equal
positions estimates J with standard error sqrt(J (1 - J) / K) (0.038 at J = 0.8, K = 112).

Locality-sensitive hashing splits the K rows into b bands of r rows. Two documents become a candidate
pair when all r rows of at least one band agree:
    P(candidate | J = s) = 1 - (1 - s^r)^b
With b = 14 bands of r = 8 rows this S-curve crosses 0.5 at s = (1 - 0.5^(1/b))^(1/r) = 0.68 and gives
    s = 0.5 -> 0.053,  s = 0.7 -> 0.56,  s = 0.8 -> 0.92,  s = 0.9 -> 0.9996,
so pairs above the 0.8 verification threshold are found 92% to 100% of the time while pairs below 0.5
rarely cost a comparison. Candidates are then verified before they join a cluster: by default on the
exact J of their shingle sets (32-bit fingerprints stored beside the signature), or, as an option, on
the estimated J of the whole signature, whose error lets pairs just under the threshold through.

The permutations: rensa's R-MinHash, h_k(x) = (a_k x + b_k) >> 32 over 64-bit shingle hashes x with
(a_k, b_k) drawn from the seed, in Rust with SIMD. `benchmarks/dedup.py` measured it against the same
permutations written in numpy (multiply, add, shift, column minimum) and against rensa's own
text-to-signature path: the shingling here is vectorised over the batch, the permutations are rensa's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import rensa
from tqdm.auto import tqdm

from moe_dag.curation.dedup.shingles import MAX_NGRAM_SIZE, shingle_hashes
from moe_dag.storage.schema import NO_DICTIONARY
from moe_dag.training.strict_config import Range, check_ranges

# Texts hashed together in one vectorised pass; keeps the pass's arrays in cache-sized pieces.
_BYTES_PER_BATCH = 1 << 21

# Every column but `source` is near unique or random: written without a parquet dictionary.
SIGNATURE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False, metadata=NO_DICTIONARY),
        pa.field("source", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False, metadata=NO_DICTIONARY),
        pa.field("signature", pa.list_(pa.uint32()), nullable=False, metadata=NO_DICTIONARY),
    ]
)
# With `verification: exact`, each document's shingles as 32-bit fingerprints (the top half of each
# 64-bit shingle hash): the exact Jaccard of two documents is that of their fingerprint
# sets, unless two distinct shingles of the pair share a fingerprint (about |A| |B| / 2^32: 1e-5 for two
# documents of 300 words). Four bytes a word, half what the 64-bit hashes took.
FINGERPRINTS_FIELD = pa.field("fingerprints", pa.list_(pa.uint32()), nullable=False, metadata=NO_DICTIONARY)


# A signature holds num_bands x rows_per_band 32-bit hashes, and the global step holds 40 bytes per band
# of every document: at most 16,384 hashes (64 KiB a document; RefinedWeb's 20 x 450 fits), bands and
# rows each at most 1,024.
MAX_BANDS_OR_ROWS = 1024
MAX_HASHES = 16_384


@dataclass(kw_only=True)
class MinHashConfig:
    num_bands: Annotated[int, Range(1, MAX_BANDS_OR_ROWS)] = 14
    rows_per_band: Annotated[int, Range(1, MAX_BANDS_OR_ROWS)] = 8
    ngram_size: Annotated[int, Range(1, MAX_NGRAM_SIZE)] = 5
    seed: int = 1
    jaccard_threshold: float = 0.8
    # How a candidate pair is verified: "exact" (the default) on the exact Jaccard of the two documents'
    # shingle sets, from 32-bit fingerprints the signature files then carry (4 bytes a word; the global
    # step reads them for candidates only), or "estimated" from the full signature (equal rows / K,
    # standard error 0.038 at 0.8 for K = 112: pairs just under the threshold pass one time in three;
    # signature files of K x 4 bytes a document whatever its length).
    verification: Literal["estimated", "exact"] = "exact"

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.num_hashes > MAX_HASHES:
            raise ValueError(
                f"num_bands x rows_per_band must be at most {MAX_HASHES} hashes, got "
                f"{self.num_bands} x {self.rows_per_band} = {self.num_hashes}"
            )
        if not 0.0 < self.jaccard_threshold <= 1.0:
            raise ValueError(
                f"MinHashConfig.jaccard_threshold must lie in (0, 1], got {self.jaccard_threshold}"
            )
        if self.verification not in ("estimated", "exact"):
            raise ValueError(
                f"MinHashConfig.verification must be 'estimated' or 'exact', got {self.verification!r}"
            )

    @property
    def num_hashes(self) -> int:
        return self.num_bands * self.rows_per_band

    def signature_schema(self) -> pa.Schema:
        return (
            SIGNATURE_SCHEMA.append(FINGERPRINTS_FIELD) if self.verification == "exact" else SIGNATURE_SCHEMA
        )


def candidate_probability(similarity: float, num_bands: int, rows_per_band: int) -> float:
    """P(two documents with Jaccard `similarity` share at least one band bucket) = 1 - (1 - s^r)^b."""
    return 1.0 - (1.0 - similarity**rows_per_band) ** num_bands


def compute_signatures(table: pa.Table, config: MinHashConfig) -> pa.Table:
    """One row per document: id, source, content_hash (exact dedup) and its MinHash signature.

    A pure function of each row: any split of the documents into batches, shards or workers gives the
    same rows.
    """
    missing = {"id", "source", "text"} - set(table.column_names)
    if missing:
        raise ValueError(f"compute_signatures: the table lacks columns {sorted(missing)}")
    batches = []
    with tqdm(total=table.num_rows, desc="minhash", unit="doc", disable=None) as progress:
        for start, stop in _batch_bounds(table["text"]):
            batches.append(_signature_batch(table.slice(start, stop - start), config))
            progress.update(stop - start)
    return pa.concat_tables(batches) if batches else config.signature_schema().empty_table()


def _batch_bounds(texts: pa.ChunkedArray) -> list[tuple[int, int]]:
    """Consecutive row ranges of about `_BYTES_PER_BATCH` bytes of text each."""
    lengths = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    batch = (np.cumsum(lengths) - lengths) // _BYTES_PER_BATCH  # the batch where each text starts
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(batch)) + 1, [len(lengths)]])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _signature_batch(table: pa.Table, config: MinHashConfig) -> pa.Table:
    shingles = shingle_hashes(table["text"], config.ngram_size)
    digests = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
        shingles.hashes, shingles.offsets, config.num_hashes, config.seed
    )
    # rensa hands the digests out as Python lists only: Arrow builds the list column from them directly.
    columns = [
        table["id"],
        table["source"],
        pa.array(shingles.content_hashes, pa.string()),
        pa.array(digests.to_rows(), pa.list_(pa.uint32())),
    ]
    if config.verification == "exact":
        columns.append(_fingerprints(shingles.hashes, shingles.offsets))
    return pa.table(columns, schema=config.signature_schema())


def _fingerprints(hashes: np.ndarray, offsets: np.ndarray) -> pa.ListArray:
    """Each document's 32-bit shingle fingerprints in shingle order, repeats kept: verification makes
    sets of them for the candidates only (`clusters.exact_jaccard`), a fraction of the documents, so no
    document is sorted here."""
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32), pa.int32()), pa.array((hashes >> np.uint64(32)).astype(np.uint32))
    )


def _list_array(values: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, value_type))
