"""The mixture search's library: candidates within the epoch caps, model choice by leave-one-out error,
the proposal, the paired average and the one-sentence verdict; and the search never a stage of `run`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.mixture import MixtureConfig, SourceTokens, write_token_shard
from moe_dag.mixture.search import (
    AVERAGE,
    FitError,
    MixingLaw,
    MixtureSearchConfig,
    config_snippet,
    design_candidates,
    epoch_cap_ok,
    fit_regressions,
    loo_models,
    pack_candidate,
    propose,
    sample_candidates,
)
from moe_dag.mixture.tokenizer import TokenizerConfig, eos_id, train_tokenizer
from moe_dag.training.compare import (
    average_bits_per_byte,
    gain_of_replicas,
    mean_document_losses,
    paired_gain,
    verdict,
)

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


def test_a_latin_hypercube_design_covers_the_dirichlet_in_strata_and_keeps_the_caps() -> None:
    from scipy.stats import beta

    capacity = {"code": 100_000, "intl": 30_000, "prose": 200_000}
    config = MixtureSearchConfig(candidates=12, concentration=5.0, design="latin_hypercube")
    shares = sample_candidates(WEIGHTS, capacity, 200_000, 1.0, config)
    assert shares.shape == (12, 3) and np.allclose(shares.sum(axis=1), 1)
    assert epoch_cap_ok(shares, np.array([100_000, 30_000, 200_000.0]), 200_000, 1.0).all()
    again = sample_candidates(WEIGHTS, capacity, 200_000, 1.0, config)
    other = sample_candidates(
        WEIGHTS, capacity, 200_000, 1.0, MixtureSearchConfig(**{**vars(config), "seed": 1})
    )
    assert np.array_equal(shares, again) and not np.allclose(shares, other)
    # Without caps: the same distribution as the Dirichlet's (a share's marginal is Beta(alpha_s,
    # alpha_0 - alpha_s)), and closer to it than independent draws are on average.
    alpha = 3.0 * np.array([WEIGHTS[s] for s in SOURCES])
    rng = np.random.default_rng(0)

    def distance(drawn: np.ndarray) -> float:
        """The largest gap between a share's empirical and its Beta marginal CDF (Kolmogorov-Smirnov)."""
        gaps = []
        for j in range(3):
            x = np.sort(drawn[:, j])
            cdf = beta.cdf(x, alpha[j], alpha.sum() - alpha[j])
            n = len(x)
            gaps.append(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))
        return max(gaps)

    designed = [distance(design_candidates(WEIGHTS, 3.0, 32, rng)) for _ in range(20)]
    independent = [distance(rng.dirichlet(alpha, size=32)) for _ in range(20)]
    assert np.mean(designed) < 0.75 * np.mean(independent)


def _documents_read(folder, shards: dict[str, SourceTokens], eos: int) -> dict[str, list[int]]:
    """Each source's documents in the order train.npy holds them (the last, cut one left out)."""
    known = {
        tuple(tokens.document(i).tolist()): (source, i)
        for source, tokens in shards.items()
        for i in range(len(tokens))
    }
    stream = np.load(folder / "train.npy").reshape(-1).tolist()
    read: dict[str, list[int]] = {source: [] for source in shards}
    start = 0
    for end, token in enumerate(stream):
        if token == eos:
            source, index = known[tuple(stream[start : end + 1])]
            read[source].append(index)
            start = end + 1
    return read


def test_candidates_differ_only_in_weights_each_source_reads_its_documents_in_one_order(tmp_path) -> None:
    """A candidate is an index-level view of the same token shards: every candidate reads each source's
    documents in the same seeded order, only how many of them differs, so candidates' losses differ by
    their weights and not by which documents they happened to draw."""
    rng = np.random.default_rng(0)
    words = ["data", "model", "expert", "token", "route", "mix", "shard", "proxy"]
    tables = {
        source: pa.table(
            {
                "id": [f"{source}{i}" for i in range(40)],
                "text": [
                    f"{source} {i} " + " ".join(rng.choice(words, size=rng.integers(3, 30)))
                    for i in range(40)
                ],
            }
        )
        for source in SOURCES
    }
    tokenizer = train_tokenizer(
        (t for table in tables.values() for t in table["text"].to_pylist()), TokenizerConfig(vocab_size=300)
    )
    eos = eos_id(tokenizer, "<|endoftext|>")
    shards = {
        s: SourceTokens(s, [write_token_shard(t, tokenizer, eos, tmp_path / "shards", s)])
        for s, t in tables.items()
    }
    recipe = MixtureConfig(weights=WEIGHTS, seq_len=32, total_tokens=33 * 60)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    orders = []
    for name, shares in (
        ("a", {"code": 0.6, "intl": 0.1, "prose": 0.3}),
        ("b", {"code": 0.1, "intl": 0.5, "prose": 0.4}),
    ):
        pack_candidate(shards, shares, vocab, eos, recipe, tmp_path / name)
        orders.append(_documents_read(tmp_path / name, shards, eos))
    for source in SOURCES:
        first, second = orders[0][source], orders[1][source]
        shorter = min(len(first), len(second))
        assert shorter >= 3 and first[:shorter] == second[:shorter]
    # The weights do change how much of each source is read.
    assert len(orders[0]["code"]) > len(orders[1]["code"]) and len(orders[0]["intl"]) < len(orders[1]["intl"])


def test_replicas_are_averaged_per_document() -> None:
    first = pa.table({"source": ["a", "b"], "id": ["1", "2"], "nll_nats": [1.0, 4.0], "num_bytes": [5, 6]})
    second = pa.table({"source": ["b", "a"], "id": ["2", "1"], "nll_nats": [2.0, 3.0], "num_bytes": [6, 5]})
    assert mean_document_losses([first, second])["nll_nats"].to_pylist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="different documents"):
        mean_document_losses([first, second.set_column(1, "id", pa.array(["3", "1"]))])


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
    assert set(fit.loo_rmse) == {"linear", "log_linear", "quadratic", "gaussian_process", "mixing_law"}
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


# Data Mixing Laws' form per source, L_s = c_s + k_s exp(t_s . r): each source's loss falls as its own
# share grows (t_ss < 0) and moves a little with the others'.
_LAW_C = np.array([3.2, 4.3, 3.2])
_LAW_K = np.array([0.25, 0.4, 0.1])
_LAW_T = np.array([[-2.0, 1.0, 0.2], [0.8, -3.5, 0.1], [1.0, 1.8, -0.5]])


def _law_swarm(count: int, noise: float, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(3 * np.array([WEIGHTS[s] for s in SOURCES]), size=count)
    exact_CS = _LAW_C + _LAW_K * np.exp(shares @ _LAW_T.T)
    losses = {s: exact_CS[:, i] + rng.normal(0, noise, count) for i, s in enumerate(SOURCES)}
    losses[AVERAGE] = np.mean([losses[s] for s in SOURCES], axis=0)
    return shares, losses


def test_the_mixing_law_recovers_a_law_that_holds() -> None:
    shares, losses = _law_swarm(16, noise=0.0)
    unseen = np.random.default_rng(1).dirichlet([1.0, 1.0, 1.0], size=50)
    for i, source in enumerate(SOURCES):
        law = MixingLaw().fit(shares, losses[source])
        # t is known up to a constant on every share (they sum to 1): the law holds t_last at 0.
        assert law.t_J == pytest.approx(_LAW_T[i, :-1] - _LAW_T[i, -1], abs=1e-3)
        expected = _LAW_C[i] + _LAW_K[i] * np.exp(unseen @ _LAW_T[i])
        assert law.predict(unseen) == pytest.approx(expected, abs=1e-5)


def test_a_law_that_holds_per_source_is_chosen_and_predicts_the_average_as_the_sources_mean() -> None:
    shares, losses = _law_swarm(16, noise=0.002)
    fit = fit_regressions(SOURCES, shares, losses)
    assert fit.model_name == "mixing_law" and not fit.failed
    assert fit.loo_rmse["mixing_law"] < 0.5 * min(e for m, e in fit.loo_rmse.items() if m != "mixing_law")
    assert fit.spearman_loo > 0.95
    # Every target's leave-one-out error is at the noise's scale, so the proposal's interval is too.
    assert max(fit.target_loo_rmse.values()) < 0.005
    unseen = np.random.default_rng(2).dirichlet([1.0, 1.0, 1.0], size=20)
    sources_mean = np.mean([fit.predict(unseen, s) for s in SOURCES], axis=0)
    assert fit.predict(unseen) == pytest.approx(sources_mean)
    proposal = propose(fit, WEIGHTS, dict.fromkeys(SOURCES, 10**9), 100_000, 4.0, MixtureSearchConfig())
    assert proposal.predicted < fit.predict(np.array([[WEIGHTS[s] for s in SOURCES]]))[0]
    assert np.mean(list(proposal.predicted_sources.values())) == pytest.approx(proposal.predicted)


class _NotConverged:
    success, cost, x = False, 0.0, None


def test_a_law_that_does_not_converge_is_left_out_of_the_choice(monkeypatch) -> None:
    import scipy.optimize

    from moe_dag.mixture import search

    shares, losses = _law_swarm(8, noise=0.002)
    monkeypatch.setattr(scipy.optimize, "least_squares", lambda *args, **kwargs: _NotConverged())
    with pytest.raises(FitError, match="converged from none of its 8 starts"):
        MixingLaw().fit(shares, losses["code"])
    families = {name: family for name, family in loo_models().items() if name in ("linear", "mixing_law")}
    monkeypatch.setattr(search, "loo_models", lambda: families)
    fit = fit_regressions(SOURCES, shares, losses)
    assert fit.model_name == "linear" and set(fit.loo_rmse) == {"linear"}
    assert "converged from none" in fit.failed["mixing_law"]
    monkeypatch.setattr(search, "loo_models", lambda: {"mixing_law": families["mixing_law"]})
    with pytest.raises(FitError, match="no model family could be fitted"):
        fit_regressions(SOURCES, shares, losses)


def test_too_few_runs_for_the_law_leave_it_out() -> None:
    """A search of 4 candidates fits each fold on 3 runs: fewer than the law's 4 numbers a source."""
    shares, losses = _law_swarm(5, noise=0.002)
    MixingLaw().fit(shares, losses["code"])  # 5 runs: one more than the law's numbers
    with pytest.raises(FitError, match="4 runs leave it undetermined"):
        MixingLaw().fit(shares[:4], losses["code"][:4])
    fit = fit_regressions(SOURCES, shares[:4], {target: values[:4] for target, values in losses.items()})
    assert "mixing_law" in fit.failed and fit.model_name != "mixing_law"


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


def _replicas(shift_S: np.ndarray, noise: float, seed: int = 0) -> tuple[np.ndarray, ...]:
    """[seeds, documents] bits of a base and an other mixture on 200 documents of two sources: the
    other gains 0.5% on every document, each seed moves every document of the other by `shift_S` alike
    and each document by its own noise."""
    rng = np.random.default_rng(seed)
    bytes_N = rng.integers(200, 2000, size=200).astype(float)
    sources_N = np.repeat(["a", "b"], 100)
    base_N = bytes_N * rng.uniform(2, 6, size=200)  # documents differ a lot in difficulty
    base_SN = base_N + rng.normal(0, noise, (len(shift_S), 200)) * bytes_N
    other_SN = base_SN * 0.995 + (shift_S[:, None] + rng.normal(0, noise, (len(shift_S), 200))) * bytes_N
    return base_SN, other_SN, bytes_N, sources_N


def test_the_gain_interval_counts_the_seeds_shared_noise_once() -> None:
    """Resampling documents cannot see a seed's shift shared by every document: the verdict's interval
    adds it from the per-seed gains, and adds nothing where the seeds differ by each document's noise."""
    base_SN, other_SN, bytes_N, sources_N = _replicas(np.zeros(4), noise=0.01)
    quiet = paired_gain(base_SN, other_SN, bytes_N, sources_N)
    expected = np.mean(
        [(other_SN - base_SN)[:, sources_N == s].sum(axis=1) / bytes_N[sources_N == s].sum() for s in "ab"],
        axis=0,
    )
    assert quiet.per_seed == pytest.approx(expected.tolist())
    assert quiet.gain == pytest.approx(expected.mean())
    assert quiet.documents_ci[1] < 0 and quiet.resolved
    assert quiet.ci == pytest.approx(quiet.documents_ci, abs=0.15 * np.ptp(quiet.documents_ci))
    shifted = paired_gain(*_replicas(np.array([-0.04, 0.03, -0.02, 0.035]), noise=0.01))
    assert shifted.documents_ci[1] < 0  # the documents alone would call it resolved
    assert not shifted.resolved and shifted.seed_share > 0.9
    one_seed = paired_gain(base_SN[:1], other_SN[:1], bytes_N, sources_N)
    assert one_seed.seed_share == 0 and one_seed.per_seed == pytest.approx([expected[0]])


def test_the_gain_of_replicas_pairs_them_by_document() -> None:
    base, better = _documents([70.0, 70.0, 70.0, 70.0]), _documents([69.0, 69.5, 69.0, 69.5])
    points, _, _ = average_bits_per_byte([base, better])
    shuffled = better.take([3, 1, 0, 2])  # any row order: replicas are paired by document
    assert gain_of_replicas([base], [shuffled]).gain == pytest.approx(points[1] - points[0])
    with pytest.raises(ValueError, match="different documents"):
        gain_of_replicas([base], [better.set_column(1, "id", pa.array(["1", "2", "3", "5"]))])


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
