"""The pipeline config: one YAML file names the sources, the lake and each stage's parameters.

Each stage owns its small config dataclass next to its code (`PrefilterConfig` beside the filters,
`MinHashConfig` beside dedup, ...); this module only reads the YAML into them, so a misspelt key fails
at load time with the file and the key path instead of deep inside a run.

Relative paths in the file resolve against the current working directory (the repository root when
run through `make` or `dagster dev`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from moe_dag.assets.bounds import ChecksConfig
from moe_dag.data.dedup import MinHashConfig
from moe_dag.data.demo_corpus import DemoCorpusConfig
from moe_dag.data.engine import RayConfig
from moe_dag.data.filters import PrefilterConfig, ToxicityConfig
from moe_dag.data.heads import BackboneConfig, CalibrationConfig, HeadTrainConfig
from moe_dag.data.mixture import MixtureConfig
from moe_dag.data.oracle import LabellingConfig, OpenAICompatibleConfig, VLLMEngineConfig
from moe_dag.data.schema import SOURCE_KINDS, SourceKind
from moe_dag.data.tokenizer import TokenizerConfig
from moe_dag.training.config import apply_overrides, preset

CONFIG_ENV_VAR = "MOE_DAG_CONFIG"
DEFAULT_CONFIG = "configs/demo.yaml"


SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


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
        # The name becomes a partition key, a lake folder (`source=<name>`) and a DuckDB value.
        if not SOURCE_NAME.fullmatch(self.name):
            raise ValueError(
                f"name {self.name!r} is not a safe identifier: use letters, digits, '_' and '-' "
                "(at most 64, starting with a letter or digit)"
            )
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"kind must be one of {list(SOURCE_KINDS)}, got {self.kind!r}")
        if not 0 < self.keep_rate <= 1:
            raise ValueError(f"keep_rate must be in (0, 1], got {self.keep_rate}")


@dataclass(kw_only=True)
class OracleConfig:
    backend: Literal["rules", "openai", "vllm"] = "rules"
    per_source: int = 200  # documents labelled per source
    seed: int = 0
    labelling: LabellingConfig = field(default_factory=LabellingConfig)  # cache commits, give-up rule
    max_failure_rate: float = 0.02  # share of the sample left unlabelled before oracle_labels fails
    openai: OpenAICompatibleConfig = field(default_factory=OpenAICompatibleConfig)  # backend "openai"
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)  # backend "vllm"

    def __post_init__(self) -> None:
        if self.backend not in ("rules", "openai", "vllm"):
            raise ValueError(f"oracle.backend must be rules, openai or vllm, got {self.backend!r}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"oracle.max_failure_rate must be in [0, 1], got {self.max_failure_rate}")


@dataclass(kw_only=True)
class TrainingLaunchConfig:
    """How the `moe_proxy` asset launches `python -m moe_dag.training` (or torchrun)."""

    preset: str = "demo"
    steps: int = 300
    seed: int = 0
    nproc_per_node: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.nproc_per_node < 1:
            raise ValueError("steps and nproc_per_node must be at least 1")
        # Checked here against the training config, not later inside the training process.
        apply_overrides(preset(self.preset), [f"{key}={value}" for key, value in self.overrides.items()])


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
    ray: RayConfig = field(default_factory=RayConfig)  # where the data stages run (default: local Ray)
    checks: ChecksConfig = field(default_factory=ChecksConfig)  # the bounds the asset checks hold

    @property
    def source_names(self) -> list[str]:
        return [source.name for source in self.sources]

    @property
    def source_kinds(self) -> dict[str, str]:
        return {source.name: source.kind for source in self.sources}

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
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: source names must be unique, got {names}")
    if not any(source.mixture_weight > 0 for source in config.sources):
        raise ValueError(f"{path}: at least one source needs a mixture_weight above 0")
    unknown_sources = sorted(set(config.checks.max_drop_share_by_source) - set(names))
    if unknown_sources:
        raise ValueError(f"{path}: checks.max_drop_share_by_source names unknown source(s) {unknown_sources}")
    prefilter_hints = typing.get_type_hints(PrefilterConfig)
    for source in config.sources:
        where = f"sources[{source.name}].prefilter"
        unknown = sorted(set(source.prefilter) - set(prefilter_hints))
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {unknown} in {where}; known: {sorted(prefilter_hints)}")
        source.prefilter = {
            key: _coerce(prefilter_hints[key], value, path, f"{where}.{key}")
            for key, value in source.prefilter.items()
        }
        try:
            config.prefilter_for(source)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {where}: {error}") from error
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
    """Check a YAML value against its field's annotation, building nested config dataclasses.

    Types are checked exactly (a string is not a list, a bool is not a number); numbers must be finite
    and not negative, and fields that are fractions, rates or probabilities must lie in [0, 1]. Ranges
    particular to one field are checked by its dataclass.
    """
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(option, value, path, where)
            except ValueError as error:
                errors.append(error)
        raise errors[0] if len(errors) == 1 else _type_error(annotation, value, path, where)
    if dataclasses.is_dataclass(annotation):
        return _build(annotation, value, path, where)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{path}: {where} must be one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise _type_error(annotation, value, path, where)
        items = [_coerce(args[0], item, path, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(annotation, value, path, where)
        return {
            _coerce(args[0], key, path, f"{where} key {key!r}"): _coerce(
                args[1], item, path, f"{where}.{key}"
            )
            for key, item in value.items()
        }
    if annotation is bool:
        if not isinstance(value, bool):
            raise _type_error(annotation, value, path, where)
        return value
    if annotation in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(annotation, value, path, where)
        if annotation is int and not float(value).is_integer():
            raise _type_error(annotation, value, path, where)
        return _check_number(annotation(value), path, where)
    if annotation in (str, Path):
        if not isinstance(value, str | Path):
            raise _type_error(annotation, value, path, where)
        return annotation(value)
    return value


UNIT_INTERVAL_SUFFIXES = ("fraction", "rate", "probability", "utilization")


def _check_number(number: float, path: Path, where: str) -> float:
    name = where.rsplit(".", 1)[-1]
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{path}: {where} must be a finite number >= 0, got {number!r}")
    if name.endswith(UNIT_INTERVAL_SUFFIXES) and number > 1:
        raise ValueError(f"{path}: {where} must lie between 0 and 1, got {number!r}")
    return number


def _type_error(annotation: Any, value: Any, path: Path, where: str) -> ValueError:
    generic = typing.get_origin(annotation) is not None
    expected = str(annotation).replace("typing.", "") if generic else annotation.__name__
    return ValueError(f"{path}: {where} must be {expected}, got {type(value).__name__} {value!r}")
