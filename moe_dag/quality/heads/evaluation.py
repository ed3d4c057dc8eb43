"""How well the heads agree with the oracle on held-out labels: per dimension, and on the keep decision.

Agreement per dimension is Spearman's rank correlation (what matters for ranking documents) with the
oracle's score on that dimension. The keep decision is compared as the FineWeb-Edu classifier was: the
F1 of the documents a head keeps against those the oracle keeps, both at the source's keep rate.

The oracle's aggregate takes few distinct values (integer rubric scores), so a cut at exactly the keep
rate would split ties arbitrarily: the oracle keeps every document scoring at least its k-th best score
(k = keep rate x documents, ties included), and the head keeps as many documents as the oracle does,
its best by score. Both keep the same number, so precision, recall and F1 coincide.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties given their average rank (as Spearman's coefficient needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):
        ranks[order[start : start + count]] = start + (count - 1) / 2
    return ranks


def spearman(predicted: np.ndarray, oracle: np.ndarray) -> float:
    """Spearman's rank correlation; NaN where it is undefined (fewer than 2 points, a constant side)."""
    predicted, oracle = np.asarray(predicted, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    if len(predicted) < 2 or np.std(predicted) == 0 or np.std(oracle) == 0:
        return float("nan")
    return float(np.corrcoef(_ranks(predicted), _ranks(oracle))[0, 1])


def agreement(predicted: np.ndarray, oracle: np.ndarray) -> dict[str, float]:
    """Pearson, Spearman and mean absolute error of predictions against oracle scores."""
    predicted, oracle = np.asarray(predicted, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    constant = len(predicted) < 2 or np.std(predicted) == 0 or np.std(oracle) == 0
    pearson = float("nan") if constant else float(np.corrcoef(predicted, oracle)[0, 1])
    mae = float(np.mean(np.abs(predicted - oracle))) if len(predicted) else float("nan")
    return {"pearson": pearson, "spearman": spearman(predicted, oracle), "mae": mae}


def keep_overlap(head: np.ndarray, oracle: np.ndarray, keep_rate: float) -> tuple[int, int]:
    """(documents both keep, documents each keeps) at `keep_rate`; see the module docstring."""
    n = len(oracle)
    if n == 0:
        return 0, 0
    k = min(n, max(1, round(keep_rate * n)))
    cut = np.sort(oracle)[::-1][k - 1]
    oracle_keeps = oracle >= cut
    kept = int(oracle_keeps.sum())
    head_keeps = np.zeros(n, dtype=bool)
    head_keeps[np.argsort(-np.asarray(head), kind="stable")[:kept]] = True
    return int((head_keeps & oracle_keeps).sum()), kept


def keep_f1(
    head: np.ndarray, oracle: np.ndarray, sources: list[str], keep_rates: Mapping[str, float]
) -> dict[str, float]:
    """F1 of the head's keep decision against the oracle's, per source and over all of them.

    Each source is cut at its own keep rate; the overall figure pools the sources' counts.
    """
    labels = np.asarray(sources, dtype=object)
    scores: dict[str, float] = {}
    both_total = kept_total = 0
    for source, rate in sorted(keep_rates.items()):
        mine = labels == source
        both, kept = keep_overlap(np.asarray(head)[mine], np.asarray(oracle)[mine], rate)
        if kept:
            scores[source] = both / kept
        both_total, kept_total = both_total + both, kept_total + kept
    scores["all"] = both_total / kept_total if kept_total else float("nan")
    return scores
