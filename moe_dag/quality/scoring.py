"""Early-exit quality scoring: the probe decides who leaves, the judge decides the rest.

Per batch, the frozen backbone runs to the probe layer and the probe scores every document on its
source's rubric. Documents whose probe aggregate is under tau_drop stop there, dropped (reason
"probe_below_tau_drop"); those at or above tau_pass stop there, kept. Thresholds are calibrated so that
at most a configured share (1%) of either exit are documents the judge would have decided otherwise.
The others continue from the probe layer's hidden states, not from the tokens, to the judge layer, and
are kept when the judge's aggregate is >= tau_keep (else reason "judge_below_tau_keep").

Every input row comes back with probe_score and judge_score (the keep aggregates; judge_score null after
an early exit), the judge's score per rubric dimension (`judge_<dimension>`), heads_version, keep and
reason, so in = kept + dropped and any decision can be traced to the head that made it: a kept row
without a judge score was kept by the probe.

`score_documents` is a plain function of an Arrow table and loaded backbone and heads, so the same call
runs in a loop, in a test, or inside a Ray actor that loads the backbone and heads once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from tqdm import tqdm

from moe_dag.quality.heads.backbone import Backbone, BackboneConfig
from moe_dag.quality.heads.heads import QualityHeads
from moe_dag.quality.heads.store import heads_version
from moe_dag.quality.heads.thresholds import CalibrationConfig, Thresholds, calibrate_source
from moe_dag.quality.oracle.base import DIMENSIONS
from moe_dag.quality.oracle.rubrics import rubric_by_name
from moe_dag.storage.schema import with_decisions

PROBE_EXIT = "probe_below_tau_drop"
JUDGE_DROP = "judge_below_tau_keep"
SCORE_COLUMNS = ("probe_score", "judge_score", "heads_version", *(f"judge_{dim}" for dim in DIMENSIONS))


def decide(
    probe_N: np.ndarray,
    judge_N: np.ndarray,
    thresholds: Thresholds,
    languages: list[str | None] | None = None,
) -> tuple[list[bool], list[str | None]]:
    """Keep flags and reasons from the aggregates (judge NaN where the document left at the probe), each
    document by its language's thresholds where it has its own (`Thresholds.languages`)."""
    dropped = thresholds.dropped_at_probe(probe_N, languages)
    judged_keep = ~dropped & thresholds.kept_by_judge(judge_N, languages)
    keep = thresholds.kept_at_probe(probe_N, languages) | judged_keep
    reason = [PROBE_EXIT if d else None if k else JUDGE_DROP for d, k in zip(dropped, keep, strict=True)]
    return keep.tolist(), reason


@torch.no_grad()
def score_documents(
    table: pa.Table, backbone: Backbone, heads: QualityHeads, thresholds: Thresholds, batch_size: int
) -> pa.Table:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rubric = rubric_by_name(thresholds.rubric)
    if rubric.name not in heads.outputs:
        raise ValueError(f"heads were trained for rubrics {sorted(heads.outputs)}, not {rubric.name!r}")
    probe_layer, judge_layer = backbone.config.probe_layer, backbone.config.judge_layer
    heads = heads.eval().to(backbone.device)
    texts = table["text"].to_pylist()
    languages = _languages(table)
    k = len(rubric.dimensions)
    probe_NK = np.zeros((len(texts), k), dtype=np.float64)
    judge_NK = np.full((len(texts), k), np.nan, dtype=np.float64)

    # Similar lengths share a batch, so little compute goes to padding.
    order = np.argsort([len(t) for t in texts], kind="stable")
    for start in tqdm(range(0, len(texts), batch_size), desc="scoring", disable=None):
        rows = order[start : start + batch_size]
        ids_BT, mask_BT = backbone.tokenize([texts[i] for i in rows])
        probe_BTD = backbone.run_layers(backbone.embed(ids_BT), mask_BT, 0, probe_layer)
        probe_BK = heads.probe(probe_BTD.float(), mask_BT, rubric.name).cpu().double().numpy()
        probe_NK[rows] = probe_BK
        aggregate_B = heads.aggregate(rubric.name, probe_BK)
        languages_B = None if languages is None else [languages[i] for i in rows]
        stay_B = ~(
            thresholds.dropped_at_probe(aggregate_B, languages_B)
            | thresholds.kept_at_probe(aggregate_B, languages_B)
        )
        if stay_B.any():
            stay = torch.from_numpy(stay_B).to(backbone.device)
            judge_STD = backbone.run_layers(probe_BTD[stay], mask_BT[stay], probe_layer, judge_layer)
            judge_SK = heads.judge(judge_STD.float(), mask_BT[stay], rubric.name)
            judge_NK[rows[stay_B]] = judge_SK.cpu().double().numpy()

    probe_N = heads.aggregate(rubric.name, probe_NK)
    judge_N = heads.aggregate(rubric.name, judge_NK)
    keep, reason = decide(probe_N, judge_N, thresholds, languages)
    exited = np.isnan(judge_N)
    version = heads_version(heads, backbone.config)

    table = table.drop_columns([c for c in SCORE_COLUMNS if c in table.column_names])
    table = table.append_column("probe_score", pa.array(probe_N, pa.float32()))
    table = table.append_column("judge_score", pa.array(judge_N, pa.float32(), mask=exited))
    for j, dim in enumerate(rubric.dimensions):
        table = table.append_column(f"judge_{dim}", pa.array(judge_NK[:, j], pa.float32(), mask=exited))
    table = table.append_column("heads_version", pa.array([version] * len(texts), pa.string()))
    return with_decisions(table, keep, reason)


def split_reusable(
    documents: pa.Table, previous: pa.Table | None, version: str, thresholds: Thresholds
) -> tuple[pa.Table | None, pa.Table]:
    """(rows of an earlier output still valid, decided again; the documents that need scoring).

    A previous row is reused when its id and text are unchanged, it carries the current heads `version`,
    and it has every score the current thresholds need (a judge score, unless it exits under the current
    tau_drop or tau_pass). Reused rows are decided again with the current thresholds, which are not part
    of the version. So a rerun after new heads rescores everything, a rerun with the same heads nothing,
    and new documents alone are scored when a source grows.
    """
    if previous is None or not previous.num_rows or "heads_version" not in previous.column_names:
        return None, documents
    probe = previous["probe_score"].to_numpy().astype(np.float64)
    languages = _languages(previous)
    exits = thresholds.dropped_at_probe(probe, languages) | thresholds.kept_at_probe(probe, languages)
    current = previous.filter(
        pc.and_(
            pc.equal(previous["heads_version"], version),
            pc.or_(pc.is_valid(previous["judge_score"]), pa.array(exits)),
        )
    )
    unchanged = current.select(["id", "text"]).join(
        documents.select(["id", "text"]), ["id", "text"], join_type="inner"
    )
    reusable = current.filter(pc.is_in(current["id"], value_set=unchanged["id"].combine_chunks()))
    todo = documents.filter(pc.invert(pc.is_in(documents["id"], value_set=reusable["id"].combine_chunks())))
    probe = reusable["probe_score"].to_numpy().astype(np.float64)
    judge = pc.fill_null(reusable["judge_score"], math.nan).to_numpy().astype(np.float64)
    return with_decisions(reusable, *decide(probe, judge, thresholds, _languages(reusable))), todo


def decision_changes(previous: pa.Table | None, decided: pa.Table, version: str) -> dict[str, dict[str, int]]:
    """Of the `decided` documents that `previous` (the shard's earlier output) had decided too: how many
    were decided again and how many of those changed keep, by why ("heads OLD -> NEW", or "new
    thresholds for heads NEW" when the same heads decided them). Counts of a shard's completion record, so
    they add up over shards (`merge_counts`); empty when nothing was decided before."""
    if previous is None or not previous.num_rows or "heads_version" not in previous.column_names:
        return {}
    before = previous.select(["id", "keep", "heads_version"]).rename_columns(["id", "kept_before", "heads"])
    joined = before.join(decided.select(["id", "keep"]), "id", join_type="inner")
    again: dict[str, int] = {}
    changed: dict[str, int] = {}
    for heads, kept_before, keep in zip(
        joined["heads"].to_pylist(),
        joined["kept_before"].to_pylist(),
        joined["keep"].to_pylist(),
        strict=True,
    ):
        why = f"new thresholds for heads {version}" if heads == version else f"heads {heads} -> {version}"
        again[why] = again.get(why, 0) + 1
        changed[why] = changed.get(why, 0) + (kept_before != keep)
    return {"decided_again": again, "decisions_changed": changed} if again else {}


def _languages(table: pa.Table) -> list[str | None] | None:
    """The documents' language codes, where language ID ran (per-language thresholds need them)."""
    return table["language"].to_pylist() if "language" in table.column_names else None


def calibrate_sources(
    documents: pa.Table,
    backbone: Backbone,
    heads: QualityHeads,
    rubrics: Mapping[str, str],
    keep_rates: Mapping[str, float],
    config: CalibrationConfig,
    batch_size: int,
    trained_on: pa.Table | None = None,
) -> dict[str, Thresholds]:
    """Thresholds per source from both heads' scores on its calibration documents (id, text, source).

    `documents` must be unseen by the heads (held-out labels, calibration sample). A source without any
    gets no thresholds; the asset check `calibrated_on_enough_documents` reports it. `trained_on` (the same
    columns): the documents the heads trained on; those of a language short of unseen documents
    (`min_unseen_per_language`) join its language group's calibration, never the source's.
    """
    thresholds = {}
    for source, keep_rate in keep_rates.items():
        mine = documents.filter(pc.equal(documents["source"], source))
        if not mine.num_rows:
            continue
        seen = _seen_of_small_languages(mine, trained_on, source, config)
        unseen = np.arange(mine.num_rows + seen.num_rows) < mine.num_rows
        mine = pa.concat_tables([mine, seen.select(mine.column_names)]) if seen.num_rows else mine
        everything = Thresholds(tau_drop=-math.inf, tau_keep=0.0, rubric=rubrics[source])  # no early exit
        scored = score_documents(mine, backbone, heads, everything, batch_size)
        probe, judge = scored["probe_score"].to_numpy(), scored["judge_score"].to_numpy()
        texts = mine["text"].to_pylist()
        thresholds[source] = calibrate_source(
            probe, judge, keep_rate, config, rubrics[source], _languages(mine), texts, unseen
        )
    return thresholds


def _seen_of_small_languages(
    unseen: pa.Table, trained_on: pa.Table | None, source: str, config: CalibrationConfig
) -> pa.Table:
    """The documents of `source` the heads trained on whose language has fewer than
    `min_unseen_per_language` unseen documents (none without languages or per-language thresholds)."""
    if trained_on is None or not config.per_language or "language" not in unseen.column_names:
        return unseen.slice(0, 0)
    seen = trained_on.filter(pc.equal(trained_on["source"], source))
    if "language" not in seen.column_names:
        return unseen.slice(0, 0)
    counts = pc.value_counts(unseen["language"]).to_pylist()
    large = [c["values"] for c in counts if c["counts"] >= config.min_unseen_per_language]
    return seen.filter(pc.invert(pc.is_in(seen["language"], value_set=pa.array(large, pa.string()))))


def calibration_warnings(thresholds: Mapping[str, Thresholds], config: CalibrationConfig) -> list[str]:
    """Sources whose calibration found no early exit, one line each (too few unseen documents is the asset
    check `calibrated_on_enough_documents`)."""
    return [
        f"{source}: no early exit (on {t.n_calibration} documents the probe picks out no exits that change "
        f"at most {config.max_decisions_changed:.0%} of the judge's decisions at the configured bound); "
        "every document runs to the judge"
        for source, t in thresholds.items()
        if t.early_exit_rate == 0.0
    ]


def early_exit_summary(scored: pa.Table, config: BackboneConfig) -> dict[str, float]:
    """Shares of documents that left at the probe (dropped, kept, either), and the share of backbone
    layer compute that saved.

    Compute is counted in layers per document (each exit skips judge_layer - probe_layer of the
    judge_layer layers a full pass runs), ignoring length differences between documents and the judge
    head itself, which is small next to the layers.
    """
    n = max(scored.num_rows, 1)
    dropped = int(pc.sum(pc.equal(scored["reason"], PROBE_EXIT)).as_py() or 0)
    passed = int(pc.sum(pc.and_(scored["keep"], pc.is_null(scored["judge_score"]))).as_py() or 0)
    exit_rate = (dropped + passed) / n
    skipped_share = (config.judge_layer - config.probe_layer) / config.judge_layer
    return {
        "documents": float(scored.num_rows),
        "early_exit_rate": exit_rate,
        "drop_exit_rate": dropped / n,
        "keep_exit_rate": passed / n,
        "layer_compute_saved": exit_rate * skipped_share,
        "kept_rate": int(pc.sum(scored["keep"]).as_py() or 0) / n,
    }
