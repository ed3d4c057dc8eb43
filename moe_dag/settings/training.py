"""The training group's settings: evaluation sets, tokenizer, mixtures, the proxy, the comparisons and
the mixture search."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from moe_dag.config import PipelineConfig, TrainingLaunchConfig
from moe_dag.mixture import MixtureConfig
from moe_dag.mixture.neutral import EvaluationConfig
from moe_dag.mixture.search import MixtureSearchConfig
from moe_dag.mixture.tokenizer import TokenizerConfig, pretrained_tokenizer_file
from moe_dag.operations.bounds import ChecksConfig
from moe_dag.settings.stage import bound


@dataclass(frozen=True, kw_only=True)
class NeutralSettings:
    neutral_share: float
    sources: list[str]


def neutral_settings(config: PipelineConfig) -> NeutralSettings:
    return NeutralSettings(neutral_share=config.evaluation.neutral_share, sources=config.source_names)


@dataclass(frozen=True, kw_only=True)
class EvaluationSetSettings:
    evaluation: EvaluationConfig
    seq_len: int
    eos_token: str


def evaluation_set_settings(config: PipelineConfig) -> EvaluationSetSettings:
    return EvaluationSetSettings(
        evaluation=config.evaluation, seq_len=config.mixture.seq_len, eos_token=config.mixture.eos_token
    )


@dataclass(frozen=True, kw_only=True)
class TokenizerSettings:
    tokenizer: TokenizerConfig
    mixture: MixtureConfig  # its held-out cut never reaches the tokenizer
    sources: list[str]
    # The digest of the pretrained tokenizer's file (`tokenizer.from`), so that a new file in the same
    # place makes the tokenizer and everything after it stale; None when the tokenizer is trained.
    pretrained_digest: str | None


def tokenizer_settings(config: PipelineConfig) -> TokenizerSettings:
    pretrained = config.tokenizer.from_
    return TokenizerSettings(
        tokenizer=config.tokenizer,
        mixture=config.mixture,
        sources=config.source_names,
        pretrained_digest=file_digest(pretrained_tokenizer_file(pretrained)) if pretrained else None,
    )


def file_digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=12).hexdigest()


@dataclass(frozen=True, kw_only=True)
class MixtureSettings:
    mixture: MixtureConfig
    sources: list[str]
    max_share_error: float = bound()

    @property
    def checks(self) -> ChecksConfig:
        return ChecksConfig(max_share_error=self.max_share_error)


def mixture_settings(config: PipelineConfig) -> MixtureSettings:
    return MixtureSettings(
        mixture=config.mixture, sources=config.source_names, max_share_error=config.checks.max_share_error
    )


@dataclass(frozen=True, kw_only=True)
class UnfilteredMixtureSettings:
    mixture: MixtureConfig
    sources: list[str]


def unfiltered_mixture_settings(config: PipelineConfig) -> UnfilteredMixtureSettings:
    return UnfilteredMixtureSettings(mixture=config.mixture, sources=config.source_names)


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    training: TrainingLaunchConfig  # with the resolved preset: any training setting retrains
    loss_window_fraction: float = bound()
    min_loss_drop_fraction: float = bound()
    max_expert_load_over_mean: float = bound()

    @property
    def checks(self) -> ChecksConfig:
        return ChecksConfig(
            loss_window_fraction=self.loss_window_fraction,
            min_loss_drop_fraction=self.min_loss_drop_fraction,
            max_expert_load_over_mean=self.max_expert_load_over_mean,
        )


def proxy_settings(config: PipelineConfig) -> ProxySettings:
    checks = config.checks
    return ProxySettings(
        training=config.training,
        loss_window_fraction=checks.loss_window_fraction,
        min_loss_drop_fraction=checks.min_loss_drop_fraction,
        max_expert_load_over_mean=checks.max_expert_load_over_mean,
    )


@dataclass(frozen=True, kw_only=True)
class ProxyEvalSettings:
    evaluation: EvaluationConfig  # which sets the proxy is scored on


def proxy_eval_settings(config: PipelineConfig) -> ProxyEvalSettings:
    return ProxyEvalSettings(evaluation=config.evaluation)


@dataclass(frozen=True, kw_only=True)
class ComparisonSettings:
    training: TrainingLaunchConfig
    evaluation: EvaluationConfig


def comparison_settings(config: PipelineConfig) -> ComparisonSettings:
    return ComparisonSettings(training=config.training, evaluation=config.evaluation)


@dataclass(frozen=True, kw_only=True)
class MixtureSearchSettings:
    """One object for the search's assets: they run together, started by `moe-dag search-mixture`."""

    search: MixtureSearchConfig
    training: TrainingLaunchConfig  # the swarm's proxies start from it
    mixture: MixtureConfig  # the configured weights, the epoch caps, the packing
    evaluation: EvaluationConfig  # the neutral set scores every proxy
    sources: list[str]


def mixture_search_settings(config: PipelineConfig) -> MixtureSearchSettings:
    return MixtureSearchSettings(
        search=config.mixture_search,
        training=config.training,
        mixture=config.mixture,
        evaluation=config.evaluation,
        sources=config.source_names,
    )
