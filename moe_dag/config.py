"""The pipeline config: one YAML file names the sources, the lake and each stage's parameters.

Each stage owns its small config dataclass next to its code (`PrefilterConfig` beside the filters,
`MinHashConfig` beside dedup, ...); this module only reads the YAML into them, so a misspelt key fails
at load time with the file and the key path instead of deep inside a run.

Relative paths in the file resolve against the current working directory (the repository root when
run through `make` or `dagster dev`).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from moe_dag.data.dedup import MinHashConfig
from moe_dag.data.demo_corpus import DemoCorpusConfig
from moe_dag.data.filters import PrefilterConfig, ToxicityConfig
from moe_dag.data.heads import BackboneConfig, CalibrationConfig, HeadTrainConfig
from moe_dag.data.mixture import MixtureConfig
from moe_dag.data.oracle import OpenAICompatibleConfig, VLLMEngineConfig
from moe_dag.data.schema import SOURCE_KINDS, SourceKind
from moe_dag.data.tokenizer import TokenizerConfig

CONFIG_ENV_VAR = "MOE_DAG_CONFIG"
DEFAULT_CONFIG = "configs/demo.yaml"


@dataclass(kw_only=True)
class SourceConfig:
    """One data source: a partition of every per-source asset."""

    name: str
    kind: SourceKind  # one of SOURCE_KINDS: "code", or a kind of text ("web", "reference", ...)
    shards: str  # a local folder or an fsspec URL holding .jsonl[.gz|.zst] or .parquet shards
    languages: list[str] | None = None  # None: skip language ID; []: any confidently identified language
    keep_rate: float = 0.7  # the share of scored documents the quality heads keep
    mixture_weight: float = 1.0  # relative share of training tokens
    # Prefilter fields that differ for this source (e.g. a punctuation rule unfit for UI strings).
    prefilter: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"kind must be one of {list(SOURCE_KINDS)}, got {self.kind!r}")


@dataclass(kw_only=True)
class OracleConfig:
    backend: Literal["rules", "openai", "vllm"] = "rules"
    per_source: int = 200  # documents labelled per source
    seed: int = 0
    openai: OpenAICompatibleConfig = field(default_factory=OpenAICompatibleConfig)  # backend "openai"
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)  # backend "vllm"

    def __post_init__(self) -> None:
        if self.backend not in ("rules", "openai", "vllm"):
            raise ValueError(f"oracle.backend must be rules, openai or vllm, got {self.backend!r}")


@dataclass(kw_only=True)
class TrainingLaunchConfig:
    """How the `moe_proxy` asset launches `python -m moe_dag.training` (or torchrun)."""

    preset: str = "demo"
    steps: int = 300
    seed: int = 0
    nproc_per_node: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class PipelineConfig:
    path: Path
    lake_root: str
    catalog_path: str
    sources: list[SourceConfig]
    prefilter: PrefilterConfig = field(default_factory=PrefilterConfig)
    toxicity: ToxicityConfig = field(default_factory=ToxicityConfig)
    dedup: MinHashConfig = field(default_factory=MinHashConfig)
    oracle: OracleConfig = field(default_factory=OracleConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    heads: HeadTrainConfig = field(default_factory=HeadTrainConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    mixture: MixtureConfig  # its weights come from the sources' mixture_weight
    training: TrainingLaunchConfig = field(default_factory=TrainingLaunchConfig)
    # `moe-dag run` also materialises the comparisons (unfiltered and dense baselines: two more runs).
    comparisons: bool = True
    demo_corpus: DemoCorpusConfig | None = None

    @property
    def source_names(self) -> list[str]:
        return [source.name for source in self.sources]

    def source(self, name: str) -> SourceConfig:
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(f"no source named {name!r} in {self.path}; sources: {self.source_names}")

    def prefilter_for(self, source: SourceConfig) -> PrefilterConfig:
        return dataclasses.replace(self.prefilter, **source.prefilter)


def config_path_from_env() -> Path:
    return Path(os.environ.get(CONFIG_ENV_VAR, DEFAULT_CONFIG))


def load_config(path: str | Path) -> PipelineConfig:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pipeline config {path} does not exist (set {CONFIG_ENV_VAR} to choose one)")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    raw["path"] = path
    # Mixture weights live on the sources, beside everything else about a source.
    mixture = raw.setdefault("mixture", {}) or {}
    if "weights" in mixture:
        raise ValueError(f"{path}: mixture.weights is taken from sources[].mixture_weight; remove it")
    mixture["weights"] = {
        s.get("name"): s.get("mixture_weight", 1.0) for s in raw.get("sources") or [] if isinstance(s, dict)
    }
    raw["mixture"] = mixture
    config = _build(PipelineConfig, raw, path, "")
    if not config.sources:
        raise ValueError(f"{path}: 'sources' lists no source")
    names = config.source_names
    for source in config.sources:
        try:
            config.prefilter_for(source)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: sources[{source.name}].prefilter: {error}") from error
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: source names must be unique, got {names}")
    return config


def _build(cls: type, values: Any, path: Path, where: str) -> Any:
    """Build dataclass `cls` from a YAML mapping, recursing into nested config dataclasses."""
    if not isinstance(values, dict):
        raise ValueError(f"{path}: {where or 'top level'} must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"{path}: unknown key(s) {unknown} in {where or 'top level'}; known: {sorted(fields)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {
        name: _coerce(hints[name], value, path, f"{where}.{name}" if where else name)
        for name, value in values.items()
    }
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: invalid {where or 'config'}: {error}") from error


def _coerce(annotation: Any, value: Any, path: Path, where: str) -> Any:
    """Build the config dataclasses a field holds (alone, optional or in a list) from their YAML value."""
    if value is None:
        return None
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and dataclasses.is_dataclass(args[0]):
        if not isinstance(value, list):
            raise ValueError(f"{path}: {where} must be a list")
        return [_build(args[0], item, path, f"{where}[{i}]") for i, item in enumerate(value)]
    for candidate in (annotation, *args):  # `X` or `X | None`
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return _build(candidate, value, path, where)
    return value
