"""Bootstrap intervals over documents: coverage, shape, strata, and why comparisons are paired."""

from __future__ import annotations

import numpy as np
import pytest

from moe_dag.training.bootstrap import paired_difference_interval, ratio_interval, resampled_sums


def documents(rng: np.random.Generator, n: int, rate: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(bits, bytes) of n documents whose bits per byte scatter around `rate`."""
    num_bytes = rng.integers(100, 1000, size=n).astype(float)
    return rng.normal(rate, 0.3, size=n) * num_bytes, num_bytes


def test_the_95_percent_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(0)
    trials = 200
    covered = sum(
        low <= 1.0 <= high
        for low, high in (ratio_interval(*documents(rng, 50), resamples=500, seed=t) for t in range(trials))
    )
    assert 0.88 <= covered / trials <= 0.99


def test_the_interval_holds_the_estimate_and_narrows_as_one_over_root_n() -> None:
    rng = np.random.default_rng(1)
    widths = {}
    for n in (100, 1600):
        bits, num_bytes = documents(rng, n)
        low, high = ratio_interval(bits, num_bytes)
        assert low < bits.sum() / num_bytes.sum() < high
        widths[n] = high - low
    assert widths[1600] / widths[100] == pytest.approx(0.25, abs=0.08)


def test_documents_with_one_rate_give_a_zero_width_interval() -> None:
    num_bytes = np.array([10.0, 200.0, 35.0, 4.0])
    low, high = ratio_interval(2.5 * num_bytes, num_bytes)
    assert low == pytest.approx(2.5) and high == pytest.approx(2.5)


def test_strata_keep_each_sources_document_count_in_every_resample() -> None:
    strata = np.array(["a"] * 5 + ["b"] * 45)
    in_a = (strata == "a").astype(float)
    sums = resampled_sums(np.stack([in_a, 1 - in_a], axis=1), strata, resamples=300)
    assert (sums[:, 0] == 5).all() and (sums[:, 1] == 45).all()
    unstratified = resampled_sums(np.stack([in_a, 1 - in_a], axis=1), resamples=300)
    assert unstratified[:, 0].std() > 1


def test_a_paired_comparison_sees_a_small_consistent_gain_that_separate_intervals_miss() -> None:
    """Document difficulty varies a lot and both models share it; one model is 2% better on every
    document. Their own intervals overlap; the paired interval of the difference excludes zero."""
    rng = np.random.default_rng(2)
    num_bytes = rng.integers(100, 1000, size=60).astype(float)
    difficulty = rng.lognormal(0.0, 0.5, size=60)
    better, worse = 0.98 * difficulty * num_bytes, difficulty * num_bytes
    better_low, better_high = ratio_interval(better, num_bytes)
    worse_low, worse_high = ratio_interval(worse, num_bytes)
    assert better_high > worse_low  # the separate intervals overlap
    low, high = paired_difference_interval(worse, better, num_bytes)
    assert 0 < low < (worse.sum() - better.sum()) / num_bytes.sum() < high


def test_no_documents_is_an_error() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ratio_interval(np.array([]), np.array([]))
