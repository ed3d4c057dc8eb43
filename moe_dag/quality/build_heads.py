"""The `quality_heads` stage as one library call: join the oracle's labels to their documents, train
the probe and judge heads on the frozen backbone, calibrate each source's thresholds on documents the
heads never saw, and save the heads with their version.

A plain function of lake tables and configs, so a test, a notebook or the Dagster asset runs the same
code; the asset only adds metadata, plots and its check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from moe_dag.quality.heads import (
    BackboneConfig,
    CalibrationConfig,
    HeadTrainConfig,
    HeldOut,
    Thresholds,
    heldout_keep_f1,
    load_backbone,
    save_heads,
    train_heads,
)
from moe_dag.quality.scoring import calibrate_sources, calibration_warnings


@dataclass(frozen=True)
class DistilledHeads:
    version: str
    labelled_documents: int
    metrics: dict[str, float]  # per-dimension agreement and keep F1 on the held-out labels
    thresholds: dict[str, Thresholds]
    calibration_warnings: list[str]
    heldout: HeldOut


def labelled_documents(labels: pa.Table, documents: pa.Table) -> pa.Table:
    """The labelled sample (id, text, source, rubric, scores, and language where language ID ran) in id
    order: the heads' training input."""
    labels = labels.select(["id", "rubric", "scores"])
    documents = documents.select(
        [c for c in ("id", "text", "source", "language") if c in documents.column_names]
    )
    return documents.join(labels, "id", join_type="inner").sort_by("id")


def distil_heads(
    labelled: pa.Table,
    calibration_sample: pa.Table,
    out_dir: Path,
    *,
    rubrics: Mapping[str, str],
    keep_rates: Mapping[str, float],
    backbone_config: BackboneConfig,
    train_config: HeadTrainConfig,
    calibration_config: CalibrationConfig,
) -> DistilledHeads:
    """Train both heads on `labelled` (see `labelled_documents`), calibrate per source on their held-out
    labels plus `calibration_sample` (id, text, source), and save them into `out_dir`."""
    backbone = load_backbone(backbone_config)
    trained = train_heads(
        backbone,
        labelled["text"].to_pylist(),
        labelled["rubric"].to_pylist(),
        [json.loads(scores) for scores in labelled["scores"].to_pylist()],
        labelled["source"].to_pylist(),
        train_config,
    )
    # The language travels with the documents: calibration is per language inside a source.
    columns = [c for c in ("id", "text", "source", "language") if c in labelled.column_names]
    heldout = labelled.select(columns).take(trained.heldout.index)
    was_trained_on = ~np.isin(np.arange(labelled.num_rows), trained.heldout.index)
    trained_on = labelled.select(columns).filter(was_trained_on)
    unseen = pa.concat_tables([heldout, calibration_sample], promote_options="permissive")
    thresholds = calibrate_sources(
        unseen,
        backbone,
        trained.heads,
        rubrics,
        keep_rates,
        calibration_config,
        backbone_config.batch_size,
        trained_on=trained_on,
    )
    metrics = trained.metrics | heldout_keep_f1(trained.heldout, keep_rates)
    version = save_heads(out_dir, trained.heads, thresholds, backbone_config, metrics)
    return DistilledHeads(
        version=version,
        labelled_documents=labelled.num_rows,
        metrics=metrics,
        thresholds=thresholds,
        calibration_warnings=calibration_warnings(thresholds, calibration_config),
        heldout=trained.heldout,
    )
