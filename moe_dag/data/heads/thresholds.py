"""Per-source thresholds for early-exit scoring, calibrated on held-out head predictions.

A document is dropped at the probe when probe < tau_drop (the judge never runs), else kept when
judge >= tau_keep. See `calibrate_thresholds` for how both are chosen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Thresholds:
    tau_drop: float
    tau_keep: float
    # How they were calibrated: on this source's held-out labels ("source") or on all of them ("pooled").
    basis: str = "source"
    n_heldout: int = 0
    # On the calibration set: share of documents leaving at the probe, and share of those the judge drops.
    early_exit_rate: float = 0.0
    exit_precision: float | None = None  # None: nothing exits


def _keep_threshold(judge: np.ndarray, keep_rate: float) -> float:
    """A judge threshold keeping `keep_rate` of `judge`, halfway between the last kept and first dropped."""
    ranked = np.sort(judge)[::-1]
    k = min(len(ranked), max(1, round(keep_rate * len(ranked))))
    if k == len(ranked):
        return 0.0  # keep everything: scores are never below 0
    return float((ranked[k - 1] + ranked[k]) / 2)


def _wilson_lower(successes: np.ndarray, trials: np.ndarray, z: float) -> np.ndarray:
    """Lower end of the Wilson score interval for a binomial proportion (one-sided, z sigmas)."""
    p = successes / trials
    centre = p + z * z / (2 * trials)
    spread = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (centre - spread) / (1 + z * z / trials)


def _calibrate(
    probe: np.ndarray, judge: np.ndarray, keep_rate: float, min_precision: float, z: float
) -> Thresholds:
    n = len(probe)
    tau_keep = _keep_threshold(judge, keep_rate)
    order = np.argsort(probe, kind="stable")
    ranked_probe = probe[order]
    judge_drops = (judge < tau_keep)[order]
    # Exiting the m lowest-probe documents: how many of them would the judge drop too?
    exits = np.arange(1, n + 1)
    precision = np.cumsum(judge_drops) / exits
    confident = _wilson_lower(np.cumsum(judge_drops), exits, z) >= min_precision
    cap = math.floor((1.0 - keep_rate) * n)
    best = 0
    for m in range(1, cap + 1):
        separable = m == n or ranked_probe[m - 1] < ranked_probe[m]  # a threshold can split ties only here
        if confident[m - 1] and separable:
            best = m
    if best == 0:
        return Thresholds(tau_drop=0.0, tau_keep=tau_keep, n_heldout=n, early_exit_rate=0.0)
    upper = ranked_probe[best] if best < n else min(1.0, ranked_probe[best - 1] + 1e-6)
    return Thresholds(
        tau_drop=float((ranked_probe[best - 1] + upper) / 2),
        tau_keep=tau_keep,
        n_heldout=n,
        early_exit_rate=best / n,
        exit_precision=float(precision[best - 1]),
    )


@dataclass(kw_only=True)
class CalibrationConfig:
    """How sure early exit must be; see `calibrate_thresholds`."""

    min_precision: float = 0.95
    z: float = 1.0
    min_labels: int = 50


def calibrate_thresholds(
    probe_scores: Sequence[float],
    judge_scores: Sequence[float],
    sources: Sequence[str],
    target_keep_rates: Mapping[str, float],
    *,
    min_precision: float = 0.95,
    z: float = 1.0,
    min_labels: int = 50,
) -> dict[str, Thresholds]:
    """Thresholds per source in `target_keep_rates`, from held-out probe and judge scores.

    tau_keep: the judge score above which the source's target share of held-out documents lies, so the
    judge alone would keep the target rate.

    tau_drop: early exit must not change decisions, only save compute. Ranking held-out documents by
    probe score, the exit set for a threshold is every document under it; tau_drop is the largest
    threshold whose exit set is, with confidence, at least `min_precision` documents the judge drops
    anyway (judge < tau_keep). Confidence: the lower end of a one-sided Wilson interval (z = 1, about
    84%) must reach `min_precision`, so a few lucky exits on a small held-out set cannot set the
    threshold (at the defaults an all-correct exit set needs about 20 documents). The exit set is never
    larger than the source's drop share (1 - keep rate), since more exits than drops would remove
    documents the judge keeps. tau_drop sits halfway between the last exited and the next probe score;
    it is 0 (no early exit) when no threshold qualifies.

    A source with fewer than `min_labels` held-out documents is calibrated on the pooled held-out set of
    all sources, still at its own keep rate: its own few labels would give a noisy quantile.
    """
    probe = np.asarray(probe_scores, dtype=np.float64)
    judge = np.asarray(judge_scores, dtype=np.float64)
    labels = np.asarray(sources, dtype=object)
    if not len(probe) == len(judge) == len(labels):
        raise ValueError(
            f"calibrate_thresholds needs equal lengths, got {len(probe)} probe, {len(judge)} judge scores "
            f"and {len(labels)} sources"
        )
    if len(probe) == 0:
        raise ValueError("calibrate_thresholds: no held-out predictions to calibrate on")
    thresholds = {}
    for source, keep_rate in target_keep_rates.items():
        if not 0.0 < keep_rate <= 1.0:
            raise ValueError(f"target keep rate for source {source!r} must be in (0, 1], got {keep_rate}")
        mine = labels == source
        if mine.sum() >= min_labels:
            thresholds[source] = _calibrate(probe[mine], judge[mine], keep_rate, min_precision, z)
        else:
            pooled = _calibrate(probe, judge, keep_rate, min_precision, z)
            thresholds[source] = replace(pooled, basis="pooled")
    return thresholds
