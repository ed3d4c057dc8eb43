"""Two evaluated runs compared on the same held-out documents: the proxy's gain over a baseline.

    gain = baseline bits per byte - proxy bits per byte        (positive: the proxy predicts better)

per source and overall, each with a 95% paired bootstrap interval (bootstrap.py): both models are scored
on the same resampled documents, so the interval reflects how consistently one beats the other, not how
hard the held-out documents happen to be. The inputs are the runs' `eval_documents.parquet`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_dag.training.bootstrap import paired_difference_interval, percentile_interval, resampled_sums
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE

Z95 = 1.96  # the normal quantile of a two-sided 95% interval


def read_document_losses(run_dir: Path) -> pa.Table:
    path = Path(run_dir) / EVAL_DOCUMENTS_FILE
    if not path.exists():
        raise ValueError(f"{path}: not found; the run was not evaluated (train with --eval-on)")
    return pq.read_table(path)


def compare_runs(proxy: pa.Table, baseline: pa.Table, *, seed: int = 0) -> dict[str, Any]:
    """{"overall": figures, "sources": {source: figures}} with figures proxy_bits_per_byte,
    baseline_bits_per_byte, gain, gain_ci, documents; both tables must score the same documents."""
    order = [("source", "ascending"), ("id", "ascending")]
    proxy, baseline = proxy.sort_by(order), baseline.sort_by(order)
    for column in ("source", "id", "num_bytes"):
        if proxy[column] != baseline[column]:
            raise ValueError(f"the two runs were scored on different held-out documents ({column} differs)")
    sources_N = np.asarray(proxy["source"].to_pylist())
    proxy_bits_N = proxy["nll_nats"].to_numpy() / math.log(2)
    baseline_bits_N = baseline["nll_nats"].to_numpy() / math.log(2)
    bytes_N = proxy["num_bytes"].to_numpy().astype(np.float64)

    def figures(mask: np.ndarray, strata: np.ndarray | None) -> dict[str, Any]:
        proxy_bpb = proxy_bits_N[mask].sum() / bytes_N[mask].sum()
        baseline_bpb = baseline_bits_N[mask].sum() / bytes_N[mask].sum()
        interval = paired_difference_interval(
            baseline_bits_N[mask], proxy_bits_N[mask], bytes_N[mask], strata, seed=seed
        )
        return {
            "proxy_bits_per_byte": float(proxy_bpb),
            "baseline_bits_per_byte": float(baseline_bpb),
            "gain": float(baseline_bpb - proxy_bpb),
            "gain_ci": list(interval),
            "documents": int(mask.sum()),
        }

    every = np.ones(len(sources_N), dtype=bool)
    return {
        "overall": figures(every, sources_N),
        "sources": {source: figures(sources_N == source, None) for source in sorted(set(sources_N.tolist()))},
    }


def mean_document_losses(runs: list[pa.Table]) -> pa.Table:
    """The per-document losses (eval_documents.parquet) of replicas of one mixture, averaged over the
    replicas: one table scored on the same documents, whose paired comparison with another mixture's
    sees less of any one seed's luck."""
    runs = _aligned(runs, "replicas")
    nll_N = np.mean([run["nll_nats"].to_numpy() for run in runs], axis=0)
    return runs[0].set_column(runs[0].schema.get_field_index("nll_nats"), "nll_nats", pa.array(nll_N))


def _aligned(runs: list[pa.Table], what: str) -> list[pa.Table]:
    """Per-document tables in one (source, id) order; refused unless they hold the same documents."""
    order = [("source", "ascending"), ("id", "ascending")]
    runs = [run.sort_by(order) for run in runs]
    for run in runs[1:]:
        for column in ("source", "id", "num_bytes"):
            if run[column] != runs[0][column]:
                raise ValueError(f"the {what} were scored on different documents ({column} differs)")
    return runs


def average_bits_per_byte(
    runs: list[pa.Table], *, seed: int = 0
) -> tuple[list[float], list[tuple[float, float]], list[tuple[float, float]]]:
    """Each run's bits per byte averaged over sources (every source weighs the same, however many
    bytes it has: the target of a mixture search), its 95% interval, and the paired 95% interval of
    each run's average minus the first run's; all runs scored on the same documents."""
    runs = _aligned(runs, "runs")
    sources_N = np.asarray(runs[0]["source"].to_pylist())
    names = sorted(set(sources_N.tolist()))
    masks_NS = np.stack([sources_N == name for name in names], axis=1).astype(np.float64)
    bytes_N = runs[0]["num_bytes"].to_numpy().astype(np.float64)
    # Per source, every run's bits and the bytes, summed over one resample of each source's documents.
    columns = [run["nll_nats"].to_numpy()[:, None] / math.log(2) * masks_NS for run in runs]
    values_NK = np.concatenate([*columns, bytes_N[:, None] * masks_NS], axis=1)
    sums_RK = resampled_sums(values_NK, sources_N, seed=seed)
    full_K = values_NK.sum(axis=0)
    width = len(names)

    def averages(sums: np.ndarray, run: int) -> np.ndarray:
        bits = sums[..., run * width : (run + 1) * width]
        return (bits / sums[..., len(runs) * width :]).mean(axis=-1)

    points = [float(averages(full_K, run)) for run in range(len(runs))]
    own = [percentile_interval(averages(sums_RK, run)) for run in range(len(runs))]
    paired = [percentile_interval(averages(sums_RK, run) - averages(sums_RK, 0)) for run in range(len(runs))]
    return points, own, paired


def verdict(steps: list[int], gains: list[float], interval: tuple[float, float], what: str) -> dict[str, Any]:
    """One sentence on a gain measured at `steps` (oldest first; the last is the budget trained), with
    the last step's 95% `interval`: resolved when it excludes zero, else how many steps would resolve it.

    The estimate assumes the interval keeps its width (it comes from which documents are scored, not from
    training) while the gain follows its measured trend in log steps between the last two budgets,
    g(s) = g(T) + b ln(s / T); resolution is where |g(s)| reaches the interval's half-width. A gain that
    did not move between the two budgets, or a single budget, gives no estimate."""
    gain, (low, high), budget = gains[-1], interval, steps[-1]
    stated = f"{what}: {gain:+.4f} bits/byte (95% interval {low:+.4f} to {high:+.4f}) at {budget} steps"
    if low > 0 or high < 0:
        return {"resolved": True, "steps_to_resolve": None, "sentence": f"{stated}."}
    needed = None
    if len(steps) > 1 and steps[-2] < budget and gains[-1] != gains[-2]:
        slope = (gains[-1] - gains[-2]) / math.log(budget / steps[-2])
        half = (high - low) / 2
        exponent = (math.copysign(half, slope) - gain) / slope
        needed = math.ceil(budget * math.exp(exponent)) if exponent < math.log(1e6) else None
    trend = (
        f"the gain's trend between {steps[-2]} and {budget} steps says about {needed} steps would resolve it"
        if needed is not None
        else "no budget in reach is measured (one budget scored, or a gain that did not grow)"
    )
    return {
        "resolved": False,
        "steps_to_resolve": needed,
        "sentence": f"{stated}: not resolved at this budget; {trend}.",
    }


@dataclass
class Gain:
    """A mixture's gain over another in average bits per byte (negative: lower loss), from replicas
    paired by seed (replica s of both mixtures shares seed s: initialisation and document order)."""

    gain: float
    per_seed: list[float]
    documents_ci: tuple[float, float]  # the documents resampled, the seeds' noise left out
    ci: tuple[float, float]  # documents' and seeds' noise both: the interval the verdict reads
    seed_share: float  # of the gain's variance, the part from training noise shared by all documents

    @property
    def resolved(self) -> bool:
        return not self.ci[0] <= 0 <= self.ci[1]


def paired_gain(
    base_SN: np.ndarray,
    other_SN: np.ndarray,
    bytes_N: np.ndarray,
    sources_N: np.ndarray,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Gain:
    """`other` minus `base` in bits per byte averaged over sources (each source alike, the search's
    target), from [seeds, documents] bits of each replica, all scored on the same documents.

    The gain is a sum over documents of each one's part, d_si (its bits' difference over its source's
    bytes and the number of sources), averaged over seeds s. Model d_si = a_i + b_s + e_si: a_i what the
    document gains (the neutral set's draw), b_s what a seed shifts on every document alike, e_si the
    seed's noise on one document. Resampling documents (a paired bootstrap within each source) measures
    var(sum of a) + var(sum of e)/S but misses var(B)/S, the shared part. The per-seed gains g_s vary by
    var(B) + var(sum of e), and var(sum of e) is measured within documents (sum over i of var_s d_si),
    so var(B) = var_s(g_s) - that (a two-way random-effects decomposition), floored at 0. The interval
    is gain +- 1.96 x sqrt(documents' variance + var(B)/S): the documents' noise, the seeds' noise on
    each document and the seeds' shared noise, each counted once. With one seed the shared part
    cannot be measured and the interval is the documents' alone."""
    rng = np.random.default_rng(seed)
    diff_SN = np.asarray(other_SN, np.float64) - np.asarray(base_SN, np.float64)
    bytes_N, sources_N = np.asarray(bytes_N, np.float64), np.asarray(sources_N)
    seeds, names = len(diff_SN), sorted(set(sources_N.tolist()))
    part_SN = np.zeros_like(diff_SN)
    drawn_R = np.zeros(resamples)
    for name in names:
        mask = sources_N == name
        part_SN[:, mask] = diff_SN[:, mask] / (bytes_N[mask].sum() * len(names))
        counts_RN = rng.multinomial(mask.sum(), np.full(mask.sum(), 1 / mask.sum()), size=resamples)
        drawn_R += (counts_RN @ diff_SN[:, mask].mean(axis=0)) / (counts_RN @ bytes_N[mask]) / len(names)
    per_seed_S = part_SN.sum(axis=1)
    gain = float(per_seed_S.mean())
    documents_var = float(np.var(drawn_R, ddof=1))
    shared_var = 0.0
    if seeds > 1:
        within = float(np.var(part_SN, axis=0, ddof=1).sum())
        shared_var = max(0.0, float(np.var(per_seed_S, ddof=1)) - within) / seeds
    half = Z95 * float(np.sqrt(documents_var + shared_var))
    return Gain(
        gain=gain,
        per_seed=per_seed_S.tolist(),
        documents_ci=(float(np.percentile(drawn_R, 2.5)), float(np.percentile(drawn_R, 97.5))),
        ci=(gain - half, gain + half),
        seed_share=shared_var / (documents_var + shared_var),
    )


def gain_of_replicas(base: list[pa.Table], other: list[pa.Table]) -> Gain:
    """`paired_gain` from replicas' per-document losses (eval_documents.parquet: source, id, nll_nats,
    num_bytes), replica s of each mixture trained with seed s; all must score the same documents."""
    tables = _aligned([*base, *other], "replicas")
    bits_RN = np.stack([table["nll_nats"].to_numpy() / math.log(2) for table in tables])
    return paired_gain(
        bits_RN[: len(base)],
        bits_RN[len(base) :],
        tables[0]["num_bytes"].to_numpy(),
        np.asarray(tables[0]["source"].to_pylist()),
    )
