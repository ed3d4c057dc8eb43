"""Early exit bounded on the share of all a source's decisions it changes (`max_decisions_changed`)."""

import numpy as np
import pytest

from moe_dag.quality.heads import CalibrationConfig, calibrate_source, calibration_sample_size
from moe_dag.quality.heads.thresholds import allowed_changes

DEFAULTS = CalibrationConfig()


def _population(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Known scores: judge ~ Beta(2, 2); the probe sees the judge through noise."""
    judge = rng.beta(2.0, 2.0, size=n)
    return np.clip(judge + rng.normal(scale=0.05, size=n), 0, 1), judge


def _changed(t, probe: np.ndarray, judge: np.ndarray) -> np.ndarray:
    judge_keeps = judge >= t.tau_keep
    dropped, passed = t.dropped_at_probe(probe), t.kept_at_probe(probe)
    assert not (dropped & passed).any()
    return (passed | (~dropped & judge_keeps)) != judge_keeps


def test_allowed_changes_follow_the_bound_and_the_margin():
    assert allowed_changes(400, CalibrationConfig(exit_z=0.0, exit_margin=0)) == 4
    assert allowed_changes(400, CalibrationConfig(exit_z=0.0, exit_margin=1)) == 3  # the demo's
    # Clopper-Pearson at 90%: 0 of 400 bounds the share at 0.57%, 1 of 400 at 0.97%, 2 at 1.33%.
    assert allowed_changes(400, CalibrationConfig(exit_margin=0)) == 1
    assert allowed_changes(400, DEFAULTS) < 0  # less the default margin of 2: no early exit
    # The library's sizes (897 at keep rate 0.7, 1,068 at 0.5): 4 and 6 at 90%, less the margin.
    assert (allowed_changes(897, DEFAULTS), allowed_changes(1068, DEFAULTS)) == (2, 4)
    assert allowed_changes(530, DEFAULTS) < 0 <= allowed_changes(531, DEFAULTS)
    with pytest.raises(ValueError, match="exit_margin"):
        CalibrationConfig(exit_margin=-1)
    with pytest.raises(ValueError, match="max_decisions_changed"):
        CalibrationConfig(max_decisions_changed=1.0)


def test_the_decisions_bound_spends_its_budget_on_both_sides():
    probe, judge = _population(897, np.random.default_rng(0))
    t = calibrate_source(probe, judge, 0.7, DEFAULTS)
    # The search lets documents leave until the allowance is spent, both sides chosen together.
    assert _changed(t, probe, judge).sum() == allowed_changes(897, DEFAULTS)
    assert t.drop_exit_rate > 0.1 and t.keep_exit_rate > 0.1 and t.early_exit_rate > 0.6
    # A wider margin or a smaller share leaves fewer documents to leave.
    for tighter in (CalibrationConfig(exit_margin=3), CalibrationConfig(max_decisions_changed=0.008)):
        fewer = calibrate_source(probe, judge, 0.7, tighter)
        assert _changed(fewer, probe, judge).sum() <= allowed_changes(897, tighter)
        assert fewer.early_exit_rate < t.early_exit_rate


@pytest.mark.parametrize("keep_rate", [0.5, 0.7])
def test_the_decisions_bound_holds_on_new_documents(keep_rate):
    """At the defaults (90% and a margin of one overturned document a side) the share of new documents'
    decisions changed passes 1% in at most 10% of calibrations. Measured over 100 calibrations a keep
    rate (seed 7): 5% at keep rate 0.5 and 2% at 0.7, about 80% of documents leaving; without the margin
    21% at both (the search stops each side just before an overturned document, which new documents do
    not respect)."""
    rng = np.random.default_rng(7)
    fresh_probe, fresh_judge = _population(100_000, rng)
    over, exits = [], []
    for _ in range(40):
        n = calibration_sample_size(keep_rate, DEFAULTS)
        t = calibrate_source(*_population(n, rng), keep_rate, DEFAULTS)
        over.append(_changed(t, fresh_probe, fresh_judge).mean() > DEFAULTS.max_decisions_changed)
        exits.append(t.early_exit_rate)
    assert np.mean(over) <= 0.10
    assert np.mean(exits) > 0.6
