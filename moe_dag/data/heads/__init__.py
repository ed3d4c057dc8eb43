"""Quality heads on a frozen backbone: a probe for early exit, a judge for the final decision."""

from moe_dag.data.heads.backbone import Backbone, BackboneConfig, load_backbone
from moe_dag.data.heads.heads import JudgeHead, JudgeHeadConfig, ProbeHead, QualityHeads
from moe_dag.data.heads.store import StoredHeads, heads_version, load_heads, save_heads
from moe_dag.data.heads.thresholds import CalibrationConfig, Thresholds, calibrate_thresholds
from moe_dag.data.heads.train import HeadTrainConfig, HeldOut, TrainedHeads, train_heads

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
    "calibrate_thresholds",
    "heads_version",
    "load_backbone",
    "load_heads",
    "save_heads",
    "train_heads",
]
