"""`calibration.exit_bound: decisions`: early exit bounded on the share of all decisions it changes."""

import numpy as np
import pytest

from moe_dag.quality.heads import CalibrationConfig, calibrate_source, calibration_sample_size
from moe_dag.quality.heads.thresholds import allowed_changes

DECISIONS = CalibrationConfig(exit_bound="decisions", exit_margin=2)


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
    assert allowed_changes(400, CalibrationConfig(exit_bound="decisions", exit_z=0.0)) == 4
    assert allowed_changes(400, CalibrationConfig(exit_bound="decisions", exit_z=0.0, exit_margin=1)) == 3
    # Clopper-Pearson at 90%: 0 of 400 bounds the share at 0.57%, 1 of 400 at 0.97%, 2 at 1.33%.
    assert allowed_changes(400, CalibrationConfig(exit_bound="decisions")) == 1
    assert allowed_changes(100, DECISIONS) == -1  # not even none: no early exit
    with pytest.raises(ValueError, match="exit_bound"):
        CalibrationConfig(exit_bound="both")
    with pytest.raises(ValueError, match="max_decisions_changed"):
        CalibrationConfig(max_decisions_changed=1.0)


def test_the_decisions_bound_spends_its_budget_and_lets_more_documents_leave():
    probe, judge = _population(897, np.random.default_rng(0))
    per_side = calibrate_source(probe, judge, 0.7, CalibrationConfig())
    decisions = calibrate_source(probe, judge, 0.7, DECISIONS)
    assert decisions.early_exit_rate > per_side.early_exit_rate + 0.1
    assert _changed(decisions, probe, judge).sum() <= allowed_changes(897, DECISIONS)
    assert decisions.drop_exit_rate > 0 and decisions.keep_exit_rate > 0  # both sides, chosen together
    drops_only = calibrate_source(
        probe, judge, 0.7, CalibrationConfig(exit_bound="decisions", keep_exits=False)
    )
    assert drops_only.tau_pass is None and drops_only.keep_exit_rate == 0.0 and drops_only.drop_exit_rate > 0


def test_the_decisions_bound_holds_on_new_documents():
    """At 90% and a margin of one overturned document a side, the share of new documents' decisions
    changed passes 1% in at most 10% of calibrations. Measured over 100 calibrations a keep rate (seed
    7): 5% at keep rates 0.5 and 0.7, about 80% of documents leaving; without the margin 17-20% (the
    search stops each side just before an overturned document, which new documents do not respect)."""
    rng = np.random.default_rng(7)
    fresh_probe, fresh_judge = _population(100_000, rng)
    over, exits = [], []
    for _ in range(40):
        t = calibrate_source(*_population(calibration_sample_size(0.5, DECISIONS), rng), 0.5, DECISIONS)
        over.append(_changed(t, fresh_probe, fresh_judge).mean() > DECISIONS.max_decisions_changed)
        exits.append(t.early_exit_rate)
    assert np.mean(over) <= 0.10
    assert np.mean(exits) > 0.6
