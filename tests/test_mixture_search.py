"""The mixture search's library: candidates within the epoch caps, model choice by leave-one-out error,
the proposal, the paired average and the one-sentence verdict; and the search never a stage of `run`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.data.mixture.search import (
    AVERAGE,
    MixtureSearchConfig,
    config_snippet,
    epoch_cap_ok,
    fit_regressions,
    propose,
    sample_candidates,
)
from moe_dag.training.compare import average_bits_per_byte, verdict

WEIGHTS = {"code": 0.3, "intl": 0.2, "prose": 0.5}
SOURCES = sorted(WEIGHTS)


def test_candidates_stay_within_every_source_epoch_cap() -> None:
    capacity = {"code": 100_000, "intl": 30_000, "prose": 200_000}
    config = MixtureSearchConfig(candidates=12, concentration=5.0)
    shares = sample_candidates(WEIGHTS, capacity, 200_000, 1.0, config)
    assert shares.shape == (12, 3) and np.allclose(shares.sum(axis=1), 1)
    assert epoch_cap_ok(shares, np.array([100_000, 30_000, 200_000.0]), 200_000, 1.0).all()
    assert (shares[:, 1] * 200_000 <= 30_000).all()
    with pytest.raises(ValueError, match="fit the epoch caps"):
        sample_candidates(WEIGHTS, {"code": 10, "intl": 10, "prose": 10}, 200_000, 1.0, config)


def _swarm(count: int, noise: float, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per-source losses that fall with the log of the source's share, as Data Mixing Laws find."""
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(10 * np.array([WEIGHTS[s] for s in SOURCES]), size=count)
    losses = {
        s: 3.0 - 0.2 * np.log(shares[:, i]) + rng.normal(0, noise, count) for i, s in enumerate(SOURCES)
    }
    losses[AVERAGE] = np.mean([losses[s] for s in SOURCES], axis=0)
    return shares, losses


def test_the_fit_ranks_unseen_mixtures_and_the_proposal_beats_the_configured_one() -> None:
    shares, losses = _swarm(16, noise=0.002)
    fit = fit_regressions(SOURCES, shares, losses)
    assert set(fit.loo_rmse) == {"linear", "log_linear", "quadratic", "gaussian_process"}
    assert fit.loo_rmse[fit.model_name] == min(fit.loo_rmse.values())
    assert fit.spearman_loo > 0.8
    capacity = dict.fromkeys(SOURCES, 10**9)
    proposal = propose(fit, WEIGHTS, capacity, 100_000, 4.0, MixtureSearchConfig())
    assert sum(proposal.shares.values()) == pytest.approx(1)
    configured = np.array([[WEIGHTS[s] for s in SOURCES]])
    # The true loss is lowest at equal shares: the proposal moves towards them, and predicts better.
    assert proposal.predicted < fit.predict(configured)[0]
    assert proposal.predicted_interval[0] < proposal.predicted < proposal.predicted_interval[1]
    assert "mixture_weight" in config_snippet(proposal)


def _documents(nll: list[float]) -> pa.Table:
    return pa.table(
        {
            "source": ["a", "a", "b", "b"],
            "id": ["1", "2", "3", "4"],
            "nll_nats": nll,
            "tokens": [10, 10, 10, 10],
            "num_bytes": [100, 100, 300, 300],
        }
    )


def test_the_average_weighs_each_source_alike_and_pairs_the_runs() -> None:
    base, better = _documents([70.0, 70.0, 70.0, 70.0]), _documents([69.0, 69.5, 69.0, 69.5])
    points, own, paired = average_bits_per_byte([base, better])
    bits = 70 / np.log(2)
    assert points[0] == pytest.approx((bits / 100 + bits / 300) / 2)
    assert points[1] < points[0] and own[1][0] <= points[1] <= own[1][1]
    assert paired[1][1] < 0 and paired[0] == (0.0, 0.0)


def test_the_verdict_says_resolved_or_how_many_steps_would_resolve_it() -> None:
    assert verdict([100, 200], [0.02, 0.05], (0.01, 0.09), "gain")["resolved"]
    growing = verdict([100, 200], [0.01, 0.02], (-0.02, 0.06), "gain")
    # Half-width 0.04, slope 0.01 / ln 2 per unit of log steps: resolved at 200 * 2^2 = 800 steps.
    assert not growing["resolved"] and growing["steps_to_resolve"] == 800
    assert "not resolved at this budget" in growing["sentence"] and "800 steps" in growing["sentence"]
    flat = verdict([200], [0.01], (-0.02, 0.04), "gain")
    assert flat["steps_to_resolve"] is None and "no budget in reach" in flat["sentence"]


def test_the_mixture_search_is_never_a_stage_of_run() -> None:
    from moe_dag.orchestration.definitions import build_definitions
    from moe_dag.orchestration.pipeline import MIXTURE_SEARCH, stages

    definitions = build_definitions()
    staged = {asset for stage in stages(definitions) for asset in stage.assets}
    graph = definitions.resolve_asset_graph()
    search = {
        key.to_user_string()
        for key in graph.get_all_asset_keys()
        if graph.get(key).group_name == MIXTURE_SEARCH
    }
    assert search == {
        "mixture_candidates",
        "candidate_proxy",
        "mixture_proposal",
        "mixture_validation",
        "mixture_search_report",
    }
    assert not staged & search
    assert "mixture_search" in {job.name for job in definitions.jobs}
