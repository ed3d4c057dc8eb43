"""Confidence intervals for held-out figures, by resampling documents (the bootstrap).

Bits per byte of a set of documents is a ratio of sums, sum(nll) / (ln 2 * sum(bytes)), and the
independent units are documents, not tokens: the tokens of one document share its topic and style, so
treating them as independent would make intervals far too narrow. The interval therefore comes from
resampling whole documents with replacement and taking percentiles of the recomputed ratio (Efron and
Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13). Pooled sources are resampled within each
source, because the split fixes how many documents each contributes. A comparison of two models on the
same documents resamples the same documents for both (a paired bootstrap), which cancels the variation
that comes from which documents happen to be held out, the larger part of each model's own interval.

Resampling is done with multinomial counts per document: sums over a resample are a matrix product
counts_RN @ values_NK, computed a block of resamples at a time to bound memory.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95
_BLOCK = 256  # resamples per block: a block's counts take 256 x N x 8 bytes


def resampled_sums(
    values_NK: np.ndarray, strata_N: np.ndarray | None = None, *, resamples: int = RESAMPLES, seed: int = 0
) -> np.ndarray:
    """[resamples, K]: the column sums of `values_NK` over resamples of its rows (N documents, K
    quantities each), drawn within each stratum when `strata_N` labels the rows."""
    values_NK = np.asarray(values_NK, dtype=np.float64)
    if values_NK.ndim != 2 or len(values_NK) == 0:
        raise ValueError(f"need a non-empty [documents, quantities] array, got shape {values_NK.shape}")
    strata_N = np.zeros(len(values_NK), dtype=np.int64) if strata_N is None else np.asarray(strata_N)
    rng = np.random.default_rng(seed)
    sums_RK = np.zeros((resamples, values_NK.shape[1]))
    for stratum in np.unique(strata_N):
        rows = values_NK[strata_N == stratum]
        uniform = np.full(len(rows), 1.0 / len(rows))
        for start in range(0, resamples, _BLOCK):
            block = min(_BLOCK, resamples - start)
            counts_RN = rng.multinomial(len(rows), uniform, size=block)
            sums_RK[start : start + block] += counts_RN @ rows
    return sums_RK


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def ratio_interval(
    numerator_N: np.ndarray,
    denominator_N: np.ndarray,
    strata_N: np.ndarray | None = None,
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(numerator) / sum(denominator) over documents."""
    sums = resampled_sums(
        np.stack([numerator_N, denominator_N], axis=1), strata_N, resamples=resamples, seed=seed
    )
    return percentile_interval(sums[:, 0] / sums[:, 1], level)


def paired_difference_interval(
    numerator_a_N: np.ndarray,
    numerator_b_N: np.ndarray,
    denominator_N: np.ndarray,
    strata_N: np.ndarray | None = None,
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of sum(a) / sum(d) - sum(b) / sum(d): two models scored on the same documents."""
    values = np.stack([numerator_a_N, numerator_b_N, denominator_N], axis=1)
    sums = resampled_sums(values, strata_N, resamples=resamples, seed=seed)
    return percentile_interval((sums[:, 0] - sums[:, 1]) / sums[:, 2], level)
