"""The quality stages' settings: the oracle's sample and labels, the heads, scoring, the catalog."""

from __future__ import annotations

from dataclasses import dataclass

from moe_dag.config import PipelineConfig
from moe_dag.operations.bounds import ChecksConfig
from moe_dag.quality.heads import BackboneConfig, CalibrationConfig, HeadTrainConfig
from moe_dag.quality.oracle import LabellingConfig, OpenAICompatibleConfig, VLLMEngineConfig
from moe_dag.settings.stage import bound, per_source


@dataclass(frozen=True, kw_only=True)
class OracleSampleSettings:
    per_source: int  # documents labelled per source
    seed: int
    calibration: CalibrationConfig  # sizes the calibration sample
    keep_rates: dict[str, float]  # by source, in the config's order
    language_id: dict[str, bool]  # by source: whether its documents carry a language


def oracle_sample_settings(config: PipelineConfig) -> OracleSampleSettings:
    return OracleSampleSettings(
        per_source=config.oracle.per_source,
        seed=config.oracle.seed,
        calibration=config.calibration,
        keep_rates={source.name: source.keep_rate for source in config.sources},
        language_id={source.name: source.languages is not None for source in config.sources},
    )


@dataclass(frozen=True, kw_only=True)
class OracleLabelSettings:
    backend: str
    openai: OpenAICompatibleConfig
    vllm: VLLMEngineConfig
    labelling: LabellingConfig
    kinds: dict[str, str]  # by source: the rubric
    max_failure_rate: float = bound()


def oracle_label_settings(config: PipelineConfig) -> OracleLabelSettings:
    oracle = config.oracle
    return OracleLabelSettings(
        backend=oracle.backend,
        openai=oracle.openai,
        vllm=oracle.vllm,
        labelling=oracle.labelling,
        kinds=config.source_kinds,
        max_failure_rate=oracle.max_failure_rate,
    )


@dataclass(frozen=True, kw_only=True)
class HeadSettings:
    backbone: BackboneConfig
    heads: HeadTrainConfig
    calibration: CalibrationConfig
    kinds: dict[str, str]  # by source: the rubric
    keep_rates: dict[str, float]  # by source: where the thresholds are calibrated
    min_head_f1: float = bound()

    @property
    def checks(self) -> ChecksConfig:
        return ChecksConfig(min_head_f1=self.min_head_f1)


def head_settings(config: PipelineConfig) -> HeadSettings:
    return HeadSettings(
        backbone=config.backbone,
        heads=config.heads,
        calibration=config.calibration,
        kinds=config.source_kinds,
        keep_rates={source.name: source.keep_rate for source in config.sources},
        min_head_f1=config.checks.min_head_f1,
    )


@dataclass(frozen=True, kw_only=True)
class ScoringSettings:
    backbone: BackboneConfig
    min_language_documents: int = bound()
    keep_rate_tolerance: float = bound()
    source: str = per_source()
    keep_rate: float = per_source(is_bound=True)  # the kept share the check holds the source to

    @property
    def checks(self) -> ChecksConfig:
        return ChecksConfig(min_language_documents=self.min_language_documents)


def scoring_settings(config: PipelineConfig, source: str) -> ScoringSettings:
    return ScoringSettings(
        backbone=config.backbone,
        min_language_documents=config.checks.min_language_documents,
        keep_rate_tolerance=config.calibration.keep_rate_tolerance,
        source=source,
        keep_rate=config.source(source).keep_rate,
    )


@dataclass(frozen=True, kw_only=True)
class CatalogSettings:
    """The catalog's views cover every stage whatever the settings: it reads none."""


def catalog_settings(config: PipelineConfig) -> CatalogSettings:
    del config  # (where the catalog lies is not what it holds)
    return CatalogSettings()
