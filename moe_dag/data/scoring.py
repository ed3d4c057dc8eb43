"""Early-exit quality scoring: the probe decides who leaves, the judge decides the rest.

Per batch, the frozen backbone runs to the probe layer and the probe scores every document. Documents
under tau_drop stop there (reason "probe_below_tau_drop", no judge score): thresholds are calibrated so
that these are documents the judge would drop anyway. The others continue from the probe layer's hidden
states, not from the tokens, to the judge layer, and are kept when the judge scores them >= tau_keep
(else reason "judge_below_tau_keep").

Every input row comes back with probe_score, judge_score (null after an early exit), heads_version,
keep and reason, so in = kept + dropped and any decision can be traced to the head that made it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from tqdm import tqdm

from moe_dag.data.heads.backbone import Backbone, BackboneConfig
from moe_dag.data.heads.heads import QualityHeads
from moe_dag.data.heads.store import heads_version
from moe_dag.data.heads.thresholds import Thresholds
from moe_dag.data.schema import with_decisions

PROBE_EXIT = "probe_below_tau_drop"
JUDGE_DROP = "judge_below_tau_keep"
SCORE_COLUMNS = ("probe_score", "judge_score", "heads_version")


@torch.no_grad()
def score_documents(
    table: pa.Table, backbone: Backbone, heads: QualityHeads, thresholds: Thresholds, batch_size: int
) -> pa.Table:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    probe_layer, judge_layer = backbone.config.probe_layer, backbone.config.judge_layer
    heads = heads.eval().to(backbone.device)
    texts = table["text"].to_pylist()
    probe_scores = np.zeros(len(texts), dtype=np.float32)
    judge_scores = np.full(len(texts), np.nan, dtype=np.float32)

    # Similar lengths share a batch, so little compute goes to padding.
    order = np.argsort([len(t) for t in texts], kind="stable")
    for start in tqdm(range(0, len(texts), batch_size), desc="scoring", disable=None):
        rows = order[start : start + batch_size]
        ids_BT, mask_BT = backbone.tokenize([texts[i] for i in rows])
        probe_BTD = backbone.run_layers(backbone.embed(ids_BT), mask_BT, 0, probe_layer)
        probe_B = heads.probe(probe_BTD.float(), mask_BT).cpu().numpy()
        probe_scores[rows] = probe_B
        stay_B = probe_B >= thresholds.tau_drop
        if stay_B.any():
            stay = torch.from_numpy(stay_B).to(backbone.device)
            judge_STD = backbone.run_layers(probe_BTD[stay], mask_BT[stay], probe_layer, judge_layer)
            judge_scores[rows[stay_B]] = heads.judge(judge_STD.float(), mask_BT[stay]).cpu().numpy()

    exited = probe_scores < thresholds.tau_drop
    keep = ~exited & (judge_scores >= thresholds.tau_keep)
    reason = [PROBE_EXIT if e else None if k else JUDGE_DROP for e, k in zip(exited, keep, strict=True)]
    version = heads_version(heads, backbone.config)

    table = table.drop_columns([c for c in SCORE_COLUMNS if c in table.column_names])
    table = table.append_column("probe_score", pa.array(probe_scores, pa.float32()))
    table = table.append_column("judge_score", pa.array(judge_scores, pa.float32(), mask=exited))
    table = table.append_column("heads_version", pa.array([version] * len(texts), pa.string()))
    return with_decisions(table, keep.tolist(), reason)


def early_exit_summary(scored: pa.Table, config: BackboneConfig) -> dict[str, float]:
    """Share of documents that left at the probe, and the share of backbone layer compute that saved.

    Compute is counted in layers per document (each exit skips judge_layer - probe_layer of the
    judge_layer layers a full pass runs), ignoring length differences between documents and the judge
    head itself, which is small next to the layers.
    """
    n = scored.num_rows
    exits = int(pc.sum(pc.equal(scored["reason"], PROBE_EXIT)).as_py() or 0)
    exit_rate = exits / n if n else 0.0
    skipped_share = (config.judge_layer - config.probe_layer) / config.judge_layer
    return {
        "documents": float(n),
        "early_exit_rate": exit_rate,
        "layer_compute_saved": exit_rate * skipped_share,
        "kept_rate": (int(pc.sum(scored["keep"]).as_py() or 0) / n) if n else 0.0,
    }
