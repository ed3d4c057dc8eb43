"""Quality heads on a frozen backbone: a probe for early exit, a judge for the final decision."""

from moe_dag.quality.heads.backbone import Backbone, BackboneConfig, load_backbone
from moe_dag.quality.heads.evaluation import agreement, keep_f1, spearman
from moe_dag.quality.heads.heads import JudgeHead, JudgeHeadConfig, ProbeHead, QualityHeads, rubric_outputs
from moe_dag.quality.heads.store import StoredHeads, heads_version, load_heads, save_heads
from moe_dag.quality.heads.thresholds import (
    CalibrationConfig,
    Thresholds,
    calibrate_source,
    calibration_sample_size,
)
from moe_dag.quality.heads.train import (
    HeadTrainConfig,
    HeldOut,
    TrainedHeads,
    heldout_agreement,
    heldout_keep_f1,
    train_heads,
)

__all__ = [
    "Backbone",
    "BackboneConfig",
    "CalibrationConfig",
    "HeadTrainConfig",
    "HeldOut",
    "JudgeHead",
    "JudgeHeadConfig",
    "ProbeHead",
    "QualityHeads",
    "StoredHeads",
    "Thresholds",
    "TrainedHeads",
    "agreement",
    "calibrate_source",
    "calibration_sample_size",
    "heads_version",
    "heldout_agreement",
    "heldout_keep_f1",
    "keep_f1",
    "load_backbone",
    "load_heads",
    "rubric_outputs",
    "save_heads",
    "spearman",
    "train_heads",
]
