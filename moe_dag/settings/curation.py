"""The curation stages' settings: ingest, the filters, dedup."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moe_dag.config import PipelineConfig
from moe_dag.curation.dedup import MinHashConfig
from moe_dag.curation.filters import PrefilterConfig, ToxicityConfig
from moe_dag.operations.bounds import ChecksConfig
from moe_dag.settings.stage import bound, per_source


@dataclass(frozen=True, kw_only=True)
class IngestSettings:
    shards: str = per_source()  # the source's shard location


def ingest_settings(config: PipelineConfig, source: str) -> IngestSettings:
    return IngestSettings(shards=config.source(source).shards)


@dataclass(frozen=True, kw_only=True)
class FilterBounds:
    """The bounds of a filter stage's checks, as one source gets them."""

    source: str = per_source()  # the partition: names the source in its own bounds
    min_language_documents: int = bound()
    max_drop_share: dict[str, float] = bound()
    max_drop_share_of_source: dict[str, float] = per_source(is_bound=True)

    @property
    def checks(self) -> ChecksConfig:
        return ChecksConfig(
            min_language_documents=self.min_language_documents,
            max_drop_share=self.max_drop_share,
            max_drop_share_by_source={self.source: self.max_drop_share_of_source},
        )


def _filter_bounds(config: PipelineConfig, source: str) -> dict[str, Any]:
    checks = config.checks
    return {
        "source": source,
        "min_language_documents": checks.min_language_documents,
        "max_drop_share": checks.max_drop_share,
        "max_drop_share_of_source": checks.max_drop_share_by_source.get(source, {}),
    }


@dataclass(frozen=True, kw_only=True)
class PrefilterSettings(FilterBounds):
    prefilter: PrefilterConfig  # the section every source starts from
    kind: str = per_source()
    languages: list[str] | None = per_source()
    changes: dict[str, Any] = per_source()  # the source's own `prefilter:` block

    @property
    def filters(self) -> PrefilterConfig:
        """The section, then the changes for the source's kind, then the source's own block."""
        return self.prefilter.for_kind(self.kind).with_changes(self.changes)


def prefilter_settings(config: PipelineConfig, source: str) -> PrefilterSettings:
    own = config.source(source)
    return PrefilterSettings(
        prefilter=config.prefilter,
        kind=own.kind,
        languages=own.languages,
        changes=own.prefilter,
        **_filter_bounds(config, source),
    )


@dataclass(frozen=True, kw_only=True)
class ToxicitySettings(FilterBounds):
    toxicity: ToxicityConfig
    kind: str = per_source()
    changes: dict[str, Any] = per_source()  # the source's own `toxicity:` block

    @property
    def filters(self) -> ToxicityConfig:
        return dataclasses.replace(self.toxicity, **self.changes)


def toxicity_settings(config: PipelineConfig, source: str) -> ToxicitySettings:
    own = config.source(source)
    return ToxicitySettings(
        toxicity=config.toxicity, kind=own.kind, changes=own.toxicity, **_filter_bounds(config, source)
    )


@dataclass(frozen=True, kw_only=True)
class SignatureSettings:
    dedup: MinHashConfig
    source: str = per_source()


def signature_settings(config: PipelineConfig, source: str) -> SignatureSettings:
    return SignatureSettings(dedup=config.dedup, source=source)


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    dedup: MinHashConfig
    sources: list[str]  # in order: the survivor priority


def cluster_settings(config: PipelineConfig) -> ClusterSettings:
    return ClusterSettings(dedup=config.dedup, sources=config.source_names)


@dataclass(frozen=True, kw_only=True)
class DeduplicatedSettings:
    source: str = per_source()
    min_language_documents: int = bound()
    min_duplicate_share: float = bound()
    max_duplicate_share: float = bound()

    @property
    def checks(self) -> ChecksConfig:
        return ChecksConfig(
            min_language_documents=self.min_language_documents,
            min_duplicate_share=self.min_duplicate_share,
            max_duplicate_share=self.max_duplicate_share,
        )


def deduplicated_settings(config: PipelineConfig, source: str) -> DeduplicatedSettings:
    checks = config.checks
    return DeduplicatedSettings(
        source=source,
        min_language_documents=checks.min_language_documents,
        min_duplicate_share=checks.min_duplicate_share,
        max_duplicate_share=checks.max_duplicate_share,
    )
