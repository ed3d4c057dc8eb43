"""A mixture search by a swarm of small proxies (RegMix, Liu et al. 2024, arXiv:2407.01492; Data Mixing
Laws, Ye et al. 2024, arXiv:2403.16952).

1. `sample_candidates`: N mixtures drawn from a Dirichlet centred on the configured shares,
   alpha_s = concentration x share_s, each kept only if every source can give its share of the token
   budget within its epoch cap (share_s x budget <= max_epochs x the source's training tokens).
2. One small proxy per candidate, trained on the same token shards packed to the candidate's weights
   (`pack_candidate`: a new sampling plan over the shards, nothing tokenised again), scored on the
   neutral set (neutral.py) in bits per byte per source.
3. `fit_regressions`: from shares to each source's loss and to their average, the target. Five model
   families compete, each judged by its leave-one-out error on the average (`loo_models`); the one
   with the smallest error is used. Four are regressions fitted to the average; the fifth is Data
   Mixing Laws' exponential law fitted to each source's loss, its prediction of the average the mean of
   the sources' (`MixingLaw`). Leave-one-out because a swarm is small (tens of runs): no run can
   be spared for a separate test set, and leaving one out scores every run as unseen while fitting on
   all but one, nearly the whole swarm. Its Spearman correlation (LOO predictions against achieved
   losses) says how well the fit ranks mixtures it has not seen, which is what choosing one needs.
4. `propose`: many mixtures drawn from the same Dirichlet (the region the swarm covered: a regression
   says little outside it), the epoch caps applied, the chosen model's predictions ranked, and the
   proposal the mean of the best `top_k` (RegMix's averaging, which steadies a noisy argmin). Its
   predicted interval is prediction +- 1.96 x the leave-one-out RMSE: the error the fit made on runs it
   had not seen, seed and evaluation noise included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa

from moe_dag.mixture.build import HELDOUT_SCHEMA, MixtureConfig, pack_mixture
from moe_dag.mixture.token_shards import SourceTokens
from moe_dag.training.config import MAX_STEPS
from moe_dag.training.strict_config import Range, check_ranges

AVERAGE = "average"  # the target: the mean over sources of each source's neutral bits per byte
Z95 = 1.96
_ALPHAS = np.logspace(-4, 2, 13)
_MIN_SHARE = 1e-4  # log features need a floor; a share this small is a source left out in practice
# At least 4 proxies for a leave-one-out fit; at most 4,096 (RegMix trained 512: each is a training run).
MAX_CANDIDATES = 4096


@dataclass(kw_only=True)
class MixtureSearchConfig:
    # 24 (from 16): a fit's leave-one-out ranking over few runs is itself a draw (its rank correlation
    # moves with which candidates were drawn), and more runs both fit better and rank more steadily
    # (docs/mixture_search.md, "A search that ranks the same way twice").
    candidates: Annotated[int, Range(4, MAX_CANDIDATES)] = 24
    # Dirichlet alpha_s = concentration x configured share_s. 3 (alpha 0.6-1.5 for the demo's shares)
    # samples widely, as RegMix does: a source's log share then varies about 2.4 times as much as at 10,
    # so the candidates' losses differ by several times the training noise and the fit can rank them
    # (at 10 with 80-step proxies the spread was about the fit's error, Spearman 0.57).
    concentration: float = 3.0
    # How the candidates cover that Dirichlet: `dirichlet`, independent draws; `latin_hypercube`, a
    # space-filling design of the same distribution (`design_candidates`: each source's gamma variate
    # stratified into `candidates` equal-probability strata, the strata paired to spread the points),
    # so a swarm never clumps or leaves a region empty by chance (docs/mixture_search.md).
    design: Literal["dirichlet", "latin_hypercube"] = "latin_hypercube"
    seed: int = 0
    # The swarm's proxies: a preset of configs/models/ (None: the training section's), its steps, and
    # overrides on top. `swarm` is a 0.8M-parameter MoE, RegMix's proxy scale.
    preset: str | None = "swarm"
    steps: Annotated[int, Range(1, MAX_STEPS)] = 200
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    parallel: int = 2  # proxies trained at once (one per core on CPU, one per GPU)
    # Seeds (initialisation and each source's document order) of the two proxies that decide: the
    # configured mixture's and the proposal's, averaged per neutral document. The swarm shares seed 0.
    final_seeds: int = 2
    proposals_sampled: int = 20_000
    top_k: int = 100
    # Neutral documents each source needs before any proxy trains: its bits per byte on fewer is mostly
    # noise, and a source with none has no loss at all for the regression to fit.
    min_neutral_documents: int = 20

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.concentration <= 0:
            raise ValueError(f"concentration must be positive, got {self.concentration}")
        if self.parallel < 1 or self.final_seeds < 1:
            raise ValueError(
                f"parallel and final_seeds must be at least 1, got {self.parallel}, {self.final_seeds}"
            )
        if self.min_neutral_documents < 1:
            raise ValueError(f"min_neutral_documents must be at least 1, got {self.min_neutral_documents}")
        if not 1 <= self.top_k <= self.proposals_sampled:
            raise ValueError(f"top_k must be in [1, proposals_sampled], got {self.top_k}")


def check_neutral_documents(per_source: dict[str, int], sources: list[str], minimum: int) -> None:
    """Refuse a search whose neutral set holds fewer than `minimum` documents of some source: every
    proxy would train, and the fit then lacks (or barely measures) that source's loss."""
    short = [
        f"{source!r} has {per_source.get(source, 0)} neutral documents, fewer than {minimum}"
        for source in sources
        if per_source.get(source, 0) < minimum
    ]
    if short:
        raise ValueError(
            "the mixture search scores every source on the neutral set: "
            + "; ".join(short)
            + ". Raise evaluation.neutral_share (or give the source more shards) and rematerialise "
            "neutral_documents and evaluation_sets, or lower mixture_search.min_neutral_documents"
        )


def shares_of(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {source: weight / total for source, weight in sorted(weights.items())}


def epoch_cap_ok(shares_CS: np.ndarray, capacity_S: np.ndarray, budget: int, max_epochs: float) -> np.ndarray:
    """[C] bool: every source of each candidate fits its share of `budget` tokens within its cap."""
    return (shares_CS * budget <= max_epochs * capacity_S[None, :]).all(axis=1)


def dirichlet_around(
    shares: dict[str, float], concentration: float, count: int, rng: np.random.Generator
) -> np.ndarray:
    alpha_S = concentration * np.array([shares[source] for source in sorted(shares)])
    return rng.dirichlet(alpha_S, size=count)


def design_candidates(
    shares: dict[str, float], concentration: float, count: int, rng: np.random.Generator
) -> np.ndarray:
    """[count, sources] mixtures distributed as `dirichlet_around`'s, as a Latin hypercube: a Dirichlet
    draw is independent Gamma(alpha_s) variates normalised, and here each source's variate takes one
    value from each of `count` equal-probability strata of its distribution (the inverse CDF of a
    stratified uniform), the strata paired across sources by scipy's LHS optimised for centred
    discrepancy (spread out, not along a diagonal). Every region of the distribution gets its share
    of candidates, as independent draws give only on average."""
    from scipy.stats import gamma, qmc

    alpha_S = concentration * np.array([shares[source] for source in sorted(shares)])
    if count == 1:
        return dirichlet_around(shares, concentration, 1, rng)
    sampler = qmc.LatinHypercube(d=len(alpha_S), optimization="random-cd", seed=rng)
    uniform_CS = sampler.random(count)
    # A variate's tail below 1e-12 of probability would underflow a share to 0: never drawn by
    # stratification of at most MAX_CANDIDATES points, but clip for safety.
    gamma_CS = gamma.ppf(np.clip(uniform_CS, 1e-12, 1 - 1e-12), alpha_S[None, :])
    gamma_CS = np.maximum(gamma_CS, 1e-300)
    return gamma_CS / gamma_CS.sum(axis=1, keepdims=True)


def sample_candidates(
    weights: dict[str, float],
    capacity: dict[str, int],
    budget: int,
    max_epochs: float,
    config: MixtureSearchConfig,
) -> np.ndarray:
    """[candidates, sources] shares (sources sorted), every row within the epoch caps."""
    shares = shares_of(weights)
    capacity_S = np.array([capacity[source] for source in sorted(shares)], dtype=np.float64)
    rng = np.random.default_rng(config.seed)
    kept: list[np.ndarray] = []
    for _ in range(100):
        if config.design == "latin_hypercube":
            # One whole design of the candidates (unless a cap binds: a row over it is replaced by a
            # row of a design of as many as are missing).
            drawn = design_candidates(shares, config.concentration, config.candidates - len(kept), rng)
        else:
            drawn = dirichlet_around(shares, config.concentration, config.candidates, rng)
        kept.extend(drawn[epoch_cap_ok(drawn, capacity_S, budget, max_epochs)])
        if len(kept) >= config.candidates:
            return np.stack(kept[: config.candidates])
    raise ValueError(
        f"fewer than {config.candidates} of {100 * config.candidates} sampled mixtures fit the epoch caps "
        f"(budget {budget} tokens, max_epochs {max_epochs}, training tokens {capacity}): lower the token "
        "budget, raise mixture.max_epochs or the concentration"
    )


def pack_candidate(
    sources: dict[str, SourceTokens],
    shares: dict[str, float],
    vocab_size: int,
    eos: int,
    recipe: MixtureConfig,
    out_dir: Path,
) -> dict:
    """Pack the already tokenised `sources` to `shares` (the recipe's budget, seed and cap) into a
    training folder; scored on an evaluation set, so it holds nothing out itself."""
    weights = {source: max(share, _MIN_SHARE) for source, share in shares.items()}
    config = dataclasses.replace(recipe, weights=weights, heldout_fraction=0.0, heldout_min_documents=0)
    return pack_mixture(sources, HELDOUT_SCHEMA.empty_table(), vocab_size, eos, config, out_dir)


def _log_shares(shares: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(shares, _MIN_SHARE))


class FitError(ValueError):
    """A fit that could not be made (no converged solution, or no more runs than numbers to fit): its
    family is left out of the choice."""


class MixingLaw:
    """One source's loss as Data Mixing Laws' exponential law (Ye et al. 2024):
    L(r) = c + k exp(t . r), r the shares. The shares sum to 1, so t is known only up to a constant added
    to every t_j (absorbed by k): t_last is held at 0. Variable projection: for given t the law is linear
    in (c, k), solved exactly, and least squares moves t alone (S - 1 numbers) from starts along the
    linear fit's slope, both curvatures and several scales; the best converged start is kept. t is held
    within +-T_MAX (a source's share going from 0 to 1 changes the exponential at most e^T_MAX times:
    far steeper than any loss curve, but no overflow)."""

    T_MAX = 30.0
    _SCALES = (1.0, 2.0, 4.0, 8.0)

    def fit(self, shares_CS: np.ndarray, loss_C: np.ndarray) -> MixingLaw:
        from scipy.optimize import least_squares

        numbers = shares_CS.shape[1] + 1  # c, k and t_J
        if len(loss_C) <= numbers:
            raise FitError(
                f"the mixing law fits {numbers} numbers a source: {len(loss_C)} runs leave it undetermined"
            )
        free_CJ = shares_CS[:, :-1]

        def residuals(t_J: np.ndarray) -> np.ndarray:
            design = self._design(free_CJ, t_J)
            return design @ _least_squares(design, loss_C) - loss_C

        def from_start(t_J: np.ndarray) -> Any:
            try:
                result = least_squares(residuals, t_J, bounds=(-self.T_MAX, self.T_MAX))
            except np.linalg.LinAlgError:
                return None
            return result if result.success and np.isfinite(result.cost) else None

        slope_J = _least_squares(np.column_stack([np.ones(len(loss_C)), free_CJ]), loss_C)[1:]
        direction_J = slope_J / max(float(np.linalg.norm(slope_J)), 1e-12)
        starts = [sign * scale * direction_J for scale in self._SCALES for sign in (1.0, -1.0)]
        converged = [result for result in map(from_start, starts) if result is not None]
        if not converged:
            raise FitError(f"the mixing law converged from none of its {len(starts)} starts")
        self.t_J = min(converged, key=lambda result: result.cost).x
        self.coef = _least_squares(self._design(free_CJ, self.t_J), loss_C)
        return self

    def predict(self, shares_CS: np.ndarray) -> np.ndarray:
        return self._design(shares_CS[:, :-1], self.t_J) @ self.coef

    @staticmethod
    def _design(free_CJ: np.ndarray, t_J: np.ndarray) -> np.ndarray:
        return np.column_stack([np.ones(len(free_CJ)), np.exp(free_CJ @ t_J)])


def _least_squares(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.linalg.lstsq(design, target, rcond=None)[0]


@dataclass(frozen=True)
class Family:
    make: Callable[[], Any]  # an unfitted regressor: fit(shares_CS, loss_C), predict(shares_CS)
    # Fitted to each source's loss, the average predicted as the mean of the sources' predictions: for a
    # law about one source's loss (the mean of such laws is not one of them).
    by_source: bool = False


class _MeanOfSources:
    def __init__(self, models: list[Any]) -> None:
        self.models = models

    def predict(self, shares_CS: np.ndarray) -> np.ndarray:
        return np.mean([model.predict(shares_CS) for model in self.models], axis=0)


def loo_models() -> dict[str, Family]:
    """The model families that compete. Fitted to the average: linear in shares (the first-order
    view); linear in log shares (a source's loss falls with the log of its share); quadratic
    (interactions between sources); a Gaussian process (smooth, no form assumed); all ridge-regularised
    or noise-aware, since the swarm is small. Fitted to each source (`by_source`): Data Mixing Laws'
    exponential law (`MixingLaw`, 4 numbers a source for 3 sources). A source's loss is the simpler
    curve: it falls as its own share grows and moves with the others' shares through what they share
    with it. The average adds such curves of opposite slopes, and its shape is what is left of their
    differences, which a form fitted to the average must find from the same few runs. (scikit-learn is
    imported here, not when the config loads.)"""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, PolynomialFeatures, StandardScaler

    def gaussian_process() -> GaussianProcessRegressor:
        kernel = ConstantKernel() * RBF(length_scale=0.3) + WhiteKernel(noise_level=1e-3)
        return GaussianProcessRegressor(
            kernel=kernel, normalize_y=True, n_restarts_optimizer=2, random_state=0
        )

    return {
        "linear": Family(lambda: make_pipeline(StandardScaler(), RidgeCV(alphas=_ALPHAS))),
        "log_linear": Family(
            lambda: make_pipeline(FunctionTransformer(_log_shares), StandardScaler(), RidgeCV(alphas=_ALPHAS))
        ),
        "quadratic": Family(
            lambda: make_pipeline(PolynomialFeatures(2), StandardScaler(), RidgeCV(alphas=_ALPHAS))
        ),
        "gaussian_process": Family(gaussian_process),
        "mixing_law": Family(MixingLaw, by_source=True),
    }


def leave_one_out(make_model: Callable[[], Any], shares_CS: np.ndarray, loss_C: np.ndarray) -> np.ndarray:
    """[C] each candidate's loss predicted by the model fitted on all the others."""
    predictions = np.empty(len(loss_C))
    for left_out in range(len(loss_C)):
        rest = np.arange(len(loss_C)) != left_out
        model = make_model().fit(shares_CS[rest], loss_C[rest])
        predictions[left_out] = model.predict(shares_CS[left_out : left_out + 1])[0]
    return predictions


@dataclass
class SearchFit:
    sources: list[str]
    model_name: str
    loo_rmse: dict[str, float]  # model name -> leave-one-out RMSE on the average
    loo_predictions: np.ndarray  # [C] of the chosen model, on the average
    spearman_loo: float
    models: dict[str, Any]  # target (AVERAGE or a source) -> the chosen kind fitted on every candidate
    target_loo_rmse: dict[str, float]  # target -> the chosen kind's leave-one-out RMSE
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # family -> why its fit failed

    def predict(self, shares_CS: np.ndarray, target: str = AVERAGE) -> np.ndarray:
        return self.models[target].predict(shares_CS)


def _rmse(predicted: np.ndarray, achieved: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predicted - achieved) ** 2)))


def fit_regressions(sources: list[str], shares_CS: np.ndarray, losses: dict[str, np.ndarray]) -> SearchFit:
    """Choose the model family by leave-one-out RMSE on `losses[AVERAGE]`, then fit it to every target
    (AVERAGE and each source) on all candidates. A family whose fit fails in a fold (`FitError`) is left
    out of the choice, with the reason in `failed`."""
    from scipy.stats import spearmanr

    average_C = losses[AVERAGE]
    families = loo_models()
    loo: dict[str, dict[str, np.ndarray]] = {}  # family -> target -> [C] leave-one-out predictions
    failed: dict[str, str] = {}
    for name, family in families.items():
        try:
            if family.by_source:
                # Each fold fits every source on the same candidates: the mean of the sources'
                # predictions is the fold's prediction of the average.
                loo[name] = {s: leave_one_out(family.make, shares_CS, losses[s]) for s in sources}
                loo[name][AVERAGE] = np.mean([loo[name][s] for s in sources], axis=0)
            else:
                loo[name] = {AVERAGE: leave_one_out(family.make, shares_CS, average_C)}
        except FitError as error:
            failed[name] = str(error)
    if not loo:
        raise FitError(f"no model family could be fitted to the swarm: {failed}")
    rmse = {name: _rmse(predicted[AVERAGE], average_C) for name, predicted in loo.items()}
    chosen = min(rmse, key=rmse.__getitem__)
    family, predicted = families[chosen], loo[chosen]
    predicted |= {s: leave_one_out(family.make, shares_CS, losses[s]) for s in sources if s not in predicted}
    target_rmse = {target: _rmse(values, losses[target]) for target, values in predicted.items()}
    models: dict[str, Any] = {s: family.make().fit(shares_CS, losses[s]) for s in sources}
    models[AVERAGE] = (
        _MeanOfSources([models[s] for s in sources])
        if family.by_source
        else family.make().fit(shares_CS, average_C)
    )
    rho = spearmanr(predicted[AVERAGE], average_C).statistic
    return SearchFit(sources, chosen, rmse, predicted[AVERAGE], float(rho), models, target_rmse, failed)


@dataclass
class Proposal:
    shares: dict[str, float]
    predicted: float
    predicted_interval: tuple[float, float]
    predicted_sources: dict[str, float]


def propose(
    fit: SearchFit,
    weights: dict[str, float],
    capacity: dict[str, int],
    budget: int,
    max_epochs: float,
    config: MixtureSearchConfig,
) -> Proposal:
    """The mean of the `top_k` sampled mixtures the fit predicts lowest, within the epoch caps."""
    shares = shares_of(weights)
    rng = np.random.default_rng(config.seed + 1)
    drawn = dirichlet_around(shares, config.concentration, config.proposals_sampled, rng)
    capacity_S = np.array([capacity[source] for source in fit.sources], dtype=np.float64)
    drawn = drawn[epoch_cap_ok(drawn, capacity_S, budget, max_epochs)]
    best = drawn[np.argsort(fit.predict(drawn))[: config.top_k]]
    chosen_S = best.mean(axis=0)  # a mean of capped mixtures is capped too: the caps are linear
    predicted = float(fit.predict(chosen_S[None, :])[0])
    half = Z95 * fit.target_loo_rmse[AVERAGE]
    return Proposal(
        shares={source: float(share) for source, share in zip(fit.sources, chosen_S, strict=True)},
        predicted=predicted,
        predicted_interval=(predicted - half, predicted + half),
        predicted_sources={s: float(fit.predict(chosen_S[None, :], s)[0]) for s in fit.sources},
    )


def average_loss(per_source: dict[str, float], sources: list[str]) -> float:
    return float(np.mean([per_source[source] for source in sources]))


def replica_name(name: str, seed: int) -> str:
    """The run name of replica `seed` of mixture `name` (seed 0 keeps the name: the swarm's seed)."""
    return name if seed == 0 else f"{name}_seed{seed}"


def results_table(
    names: list[str], sources: list[str], shares_CS: np.ndarray, losses: dict[str, np.ndarray], fit: SearchFit
) -> pa.Table:
    """One row per candidate: its shares, achieved bits per byte per source and on average, and the
    leave-one-out prediction of the average."""
    columns: dict[str, Any] = {"candidate": names}
    columns |= {f"share_{s}": shares_CS[:, i] for i, s in enumerate(sources)}
    columns |= {f"bits_per_byte_{s}": losses[s] for s in sources}
    columns |= {"bits_per_byte_average": losses[AVERAGE], "loo_predicted_average": fit.loo_predictions}
    return pa.table(columns)


def config_snippet(proposal: Proposal, digits: int = 3) -> str:
    """The proposal as the sources' `mixture_weight` lines of a pipeline config."""
    low, high = proposal.predicted_interval
    lines = [
        f"# proposed by the mixture search: predicted neutral bits per byte {proposal.predicted:.4f} "
        f"(95% {low:.4f}-{high:.4f})",
        "sources:",
    ]
    for source, share in proposal.shares.items():
        lines += [f"  - name: {source}", f"    mixture_weight: {round(share, digits)}"]
    return "\n".join(lines) + "\n"
