"""The pipeline config: one YAML file names the sources, the lake and each stage's parameters.

Each stage owns its small config dataclass next to its code (`PrefilterConfig` beside the filters,
`MinHashConfig` beside dedup, ...); this module only reads the YAML into them with the one strict
loader (`moe_dag/training/strict_config.py`, shared with the model presets and `--set` overrides), so a
misspelt key, a value of the wrong type, a duplicate key or a zero size fails at load time with the
file and the key path instead of deep inside a run. Rules across fields (a code source takes no
language list, mixture weights, the training preset and its overrides) are checked here too.

Relative paths in the file resolve against the current working directory (the repository root when
run through `make` or `dagster dev`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from moe_dag.curation.dedup import MinHashConfig
from moe_dag.curation.demo_corpus import DemoCorpusConfig
from moe_dag.curation.filters import PrefilterConfig, ToxicityConfig
from moe_dag.engine import RayConfig
from moe_dag.mixture import MixtureConfig
from moe_dag.mixture.neutral import EvaluationConfig
from moe_dag.mixture.search import MixtureSearchConfig
from moe_dag.mixture.tokenizer import TokenizerConfig
from moe_dag.operations.bounds import ChecksConfig, ReasonSetting, reason_settings
from moe_dag.operations.refresh import RefreshConfig
from moe_dag.quality.heads import BackboneConfig, CalibrationConfig, HeadTrainConfig
from moe_dag.quality.oracle import LabellingConfig, OpenAICompatibleConfig, VLLMEngineConfig
from moe_dag.storage.object_store import configure_object_stores
from moe_dag.storage.schema import SOURCE_KINDS, SourceKind
from moe_dag.training.config import MAX_STEPS, Config, override_settings, preset
from moe_dag.training.strict_config import (
    NON_EMPTY,
    ConfigError,
    Range,
    build,
    check_ranges,
    checked_changes,
    read_yaml,
)

CONFIG_ENV_VAR = "MOE_DAG_CONFIG"
DEFAULT_CONFIG = "configs/demo.yaml"


SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Upper bounds (docs/configuration.md, "Ranges"): torchrun processes on one node (one per GPU, or one
# per core on CPU: 128 covers the largest machines of either), nodes in one training run, and documents
# the oracle labels per source (a million gpt-oss-120B labels is days of a large vLLM cluster).
MAX_PROCESSES_PER_NODE = 128
MAX_NODES = 4096
MAX_LABELS_PER_SOURCE = 1_000_000
# Keys a file must not give, and what to do instead: one filled in at load, and settings that were
# removed (the strict loader would call those unknown and suggest a near name, not the replacement).
REFUSED_KEYS = {
    "mixture.weights": "taken from sources[].mixture_weight; remove it",
    "calibration.exit_bound": (
        "removed: early exit is always bounded on the share of all a source's decisions it changes (what "
        "`decisions` did; `exits`, a bound per side, is gone); remove it, and set "
        "calibration.max_decisions_changed, exit_z and exit_margin if the defaults do not suit"
    ),
    "calibration.max_exit_error": (
        "removed with the bound per side of exits: use calibration.max_decisions_changed, the share of all "
        "a source's decisions early exit may change (docs/scoring.md#early-exit); remove it"
    ),
}
# Object-store calls (docs/production.md, "Object-store lakes"): a connection takes well under a second
# and S3 replies to a request in well under one; 10 minutes and an hour are for stores on the far side
# of a slow link, and 20 tries ride out minutes of throttling (botocore waits up to 20 s between tries).
MAX_CONNECT_TIMEOUT_S = 600
MAX_READ_TIMEOUT_S = 3600
MAX_STORE_ATTEMPTS = 20


@dataclass(kw_only=True)
class SourceConfig:
    """One data source: a partition of every per-source asset."""

    name: str
    kind: SourceKind  # one of SOURCE_KINDS: "code", or a kind of text ("web", "reference", ...)
    # A local folder or an fsspec URL holding .jsonl[.gz|.zst] or .parquet shards.
    shards: Annotated[str, NON_EMPTY]
    languages: list[str] | None = None  # None: skip language ID; []: any confidently identified language
    keep_rate: float = 0.7  # the share of scored documents the quality heads keep
    mixture_weight: Annotated[float, Range(0, above_low=True)] = 1.0  # relative share of training tokens
    # Prefilter fields that differ for this source (e.g. a punctuation rule unfit for UI strings).
    prefilter: dict[str, Any] = field(default_factory=dict)
    # Toxicity fields that differ for this source (e.g. `max_toxic_share` for a source of heated posts).
    toxicity: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_ranges(self)
        # The name becomes a partition key, a lake folder (`source=<name>`) and a DuckDB value.
        if not SOURCE_NAME.fullmatch(self.name):
            raise ConfigError(
                f"{self.name!r} is not a safe identifier: use letters, digits, '_' and '-' "
                "(at most 64, starting with a letter or digit)",
                "name",
            )
        if self.kind not in SOURCE_KINDS:
            raise ConfigError(f"expected one of {list(SOURCE_KINDS)}, got {self.kind!r}", "kind")
        if self.kind == "code" and self.languages is not None:
            # Language ID (fastText lid.176) names natural languages: on source code it drops nearly all.
            raise ConfigError(
                f"a source of kind 'code' takes no language list (null: language ID names natural "
                f"languages, not programming languages), got {self.languages}",
                "languages",
            )
        if not 0 < self.keep_rate <= 1:
            raise ConfigError(f"must be in (0, 1], got {self.keep_rate}", "keep_rate")


@dataclass(kw_only=True)
class ObjectStoreConfig:
    """How long a call to an object store (`s3://` shards or lake) may wait before it fails with a
    message naming the endpoint (moe_dag/storage/object_store.py). A store that stops replying fails a
    call after about 5 x attempts x read_timeout_s: s3fs tries a timed-out call 5 times itself."""

    connect_timeout_s: Annotated[float, Range(0.1, MAX_CONNECT_TIMEOUT_S)] = 5.0  # s3fs's default
    read_timeout_s: Annotated[float, Range(0.1, MAX_READ_TIMEOUT_S)] = 10.0  # each reply
    attempts: Annotated[int, Range(1, MAX_STORE_ATTEMPTS)] = 2  # botocore's tries of one request

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(kw_only=True)
class OracleConfig:
    backend: Literal["rules", "openai", "vllm"] = "rules"
    per_source: Annotated[int, Range(1, MAX_LABELS_PER_SOURCE)] = 200  # documents labelled per source
    seed: int = 0
    labelling: LabellingConfig = field(default_factory=LabellingConfig)  # cache commits, give-up rule
    max_failure_rate: float = 0.02  # share of the sample left unlabelled before oracle_labels fails
    openai: OpenAICompatibleConfig = field(default_factory=OpenAICompatibleConfig)  # backend "openai"
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)  # backend "vllm"

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.backend not in ("rules", "openai", "vllm"):
            raise ValueError(f"oracle.backend must be rules, openai or vllm, got {self.backend!r}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"oracle.max_failure_rate must be in [0, 1], got {self.max_failure_rate}")


@dataclass(kw_only=True)
class TrainingLaunchConfig:
    """How the `moe_proxy` asset launches `python -m moe_dag.training` (or torchrun)."""

    preset: str = "demo"
    steps: Annotated[int, Range(1, MAX_STEPS)] = 300
    seed: int = 0
    nproc_per_node: Annotated[int, Range(1, MAX_PROCESSES_PER_NODE)] = 1
    # Several nodes (docs/training.md, "Several nodes"): one torchrun agent per node, c10d rendezvous at
    # `rdzv_endpoint` (host:port; None: node 0's address and a free port there). The agents run as
    # tasks one per node of the Ray cluster at `ray_address` (None: `ray.address`; neither: all on this
    # machine, for tests and the demo); every node must mount the lake at the same path.
    nnodes: Annotated[int, Range(1, MAX_NODES)] = 1
    rdzv_endpoint: str | None = None
    ray_address: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # typed settings by dotted key
    # What the trainer runs: the preset with steps, seed and overrides applied. Resolved once, when the
    # pipeline config loads (in the Dagster process); the trainer receives it as a file, and the code
    # version and run folder of every training asset are digests of it, so any change to a training
    # setting (in the preset's file too) makes them stale and trains in a new folder.
    resolved: Config = field(init=False)

    def __post_init__(self) -> None:
        check_ranges(self)
        host, _, port = (self.rdzv_endpoint or "h:1").rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"must be host:port, got {self.rdzv_endpoint!r}", "rdzv_endpoint")
        try:
            config = preset(self.preset)
        except ConfigError as error:
            raise error.within("preset") from None
        config = override_settings(config, {"train.steps": self.steps, "train.seed": self.seed}, "")
        self.resolved = override_settings(config, self.overrides, origin="", key="overrides")

    def with_overrides(self, settings: dict[str, Any]) -> TrainingLaunchConfig:
        """This launch with more overrides, applied to the resolved config (the preset is not read again)."""
        changed = copy.copy(self)
        changed.overrides = {**self.overrides, **settings}
        changed.resolved = override_settings(self.resolved, settings, origin="", key="overrides")
        return changed


@dataclass(kw_only=True)
class PipelineConfig:
    path: Path
    lake_root: Annotated[str, NON_EMPTY]
    catalog_path: Annotated[str, NON_EMPTY]
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
    # When labels, heads and the mixture follow new data (moe_dag/operations/refresh.py).
    refresh: RefreshConfig = field(default_factory=RefreshConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)  # neutral and user sets
    mixture_search: MixtureSearchConfig = field(default_factory=MixtureSearchConfig)  # search-mixture
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)  # timeouts of s3:// calls

    def __post_init__(self) -> None:
        check_ranges(self)

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
        """The prefilter section, then the changes for the source's kind, then the source's own block."""
        return self.prefilter.for_kind(source.kind).with_changes(source.prefilter)

    def toxicity_for(self, source: SourceConfig) -> ToxicityConfig:
        """The toxicity section with the source's own `toxicity:` block applied over it."""
        return dataclasses.replace(self.toxicity, **source.toxicity)

    def reason_settings(self, stage: str, source: str) -> dict[str, ReasonSetting]:
        """Per drop reason of a filter stage, the per-source key that governs it for `source`, its value,
        and (prefilter) the other kinds of text whose defaults would set it looser for this source."""
        source_config = self.source(source)
        if stage != "prefiltered":
            return reason_settings(stage, self.toxicity_for(source_config), source_config)
        other_kinds = {
            kind: self.prefilter.for_kind(kind).with_changes(source_config.prefilter)
            for kind in SOURCE_KINDS
            if kind not in (source_config.kind, "code") and source_config.kind != "code"
        }
        return reason_settings(stage, self.prefilter_for(source_config), source_config, other_kinds)


def config_path_from_env() -> Path:
    return Path(os.environ.get(CONFIG_ENV_VAR, DEFAULT_CONFIG))


def config_version(path: str | Path) -> str:
    """A digest of the config file's bytes: the tag that says which config a run used."""
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=6).hexdigest()


def load_config(path: str | Path) -> PipelineConfig:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pipeline config {path} does not exist (set {CONFIG_ENV_VAR} to choose one)")
    origin = str(path)
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"the top level must be a mapping, got {type(raw).__name__}", origin=origin)
    raw["path"] = path
    for dotted, why in REFUSED_KEYS.items():
        section, key = dotted.split(".")
        if isinstance(raw.get(section), dict) and key in raw[section]:
            raise ConfigError(why, dotted, origin)
    # Mixture weights live on the sources, beside everything else about a source.
    mixture = raw.setdefault("mixture", {}) or {}
    if isinstance(mixture, dict):
        sources = raw.get("sources") or []
        mixture["weights"] = {
            s.get("name"): s.get("mixture_weight", 1.0) for s in sources if isinstance(s, dict)
        }
    raw["mixture"] = mixture
    config = build(PipelineConfig, raw, origin)
    _check_across_fields(config, origin)
    # Process-wide, as fsspec's settings are: every object-store call of this process, and of the Ray
    # workers and trainers it starts, waits no longer than the config says.
    configure_object_stores(**dataclasses.asdict(config.object_store))
    return config


def _check_across_fields(config: PipelineConfig, origin: str) -> None:
    if not config.sources:
        raise ConfigError("lists no source", "sources", origin)
    names = config.source_names
    if len(set(names)) != len(names):
        raise ConfigError(f"source names must be unique, got {names}", "sources", origin)
    unknown_sources = sorted(set(config.checks.max_drop_share_by_source) - set(names))
    if unknown_sources:
        raise ConfigError(
            f"names unknown source(s) {unknown_sources}", "checks.max_drop_share_by_source", origin
        )
    if config.training.nnodes > 1 and config.training.ray_address is None:
        config.training.ray_address = config.ray.address  # the agents go where the data stages run
    for index, source in enumerate(config.sources):
        key = f"sources[{index}].prefilter"
        source.prefilter = checked_changes(PrefilterConfig, source.prefilter, origin, key)
        try:
            config.prefilter_for(source)
        except ConfigError as error:
            raise error.within(key, origin) from None
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error), key, origin) from None
        key = f"sources[{index}].toxicity"
        source.toxicity = checked_changes(ToxicityConfig, source.toxicity, origin, key)
        try:
            config.toxicity_for(source)
        except ValueError as error:
            raise ConfigError(str(error), key, origin) from None
