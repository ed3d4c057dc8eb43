"""The bounds the asset checks hold the pipeline to, and the plain functions that test them.

Each function takes figures a stage already has (counts per reason, a metrics log, held-out F1) and
returns what is out of bounds, as sentences that name the source, the reason and the figure, so the
failed check says what went wrong without a query. The Dagster side (`moe_dag/assets/`) only wraps
them into check results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from moe_dag.curation.filters import (
    c4,
    code,
    fineweb,
    gopher_quality,
    gopher_repetition,
    language,
    perplexity,
    size,
    toxicity,
)

ANY_REASON = "default"  # the key of max_drop_share that bounds every reason not named
DEFAULT_MAX_DROP_SHARE = 0.5  # for reasons not named, unless `default` says otherwise


@dataclass(kw_only=True)
class ChecksConfig:
    # The share of a filter stage's input that one drop reason may take, by reason code; `default`
    # bounds every reason not named (0.5 when absent). A rule that suddenly drops most of a source is
    # a bug signal (a model that failed to load, a language list that does not match the source).
    max_drop_share: dict[str, float] = field(default_factory=lambda: {ANY_REASON: DEFAULT_MAX_DROP_SHARE})
    # Per source, reason codes whose bound differs from max_drop_share (a source known to be noisy).
    max_drop_share_by_source: dict[str, dict[str, float]] = field(default_factory=dict)
    # The share of a source's documents removed as duplicates. 0% where duplicates are expected, or
    # most of a source, points at the dedup parameters or the clusters rather than at the data.
    min_duplicate_share: float = 0.0
    max_duplicate_share: float = 0.5
    # Keep-decision F1 of each head against the oracle on the held-out labels (pooled over sources).
    # Keeping at random scores about the keep rate (0.7 by default); inverted heads about 0.57.
    min_head_f1: float = 0.6
    # |achieved - target| share of training tokens allowed per source in the packed mixture.
    max_share_error: float = 0.02
    # Training: the mean loss of the last `loss_window_fraction` of steps must lie at least
    # `min_loss_drop_fraction` (relative) below the mean of the first as many steps.
    loss_window_fraction: float = 0.1
    min_loss_drop_fraction: float = 0.01
    # Router: max(load) / mean(load) per MoE layer at the last step (1.0 is perfect balance).
    max_expert_load_over_mean: float = 2.0
    # A language with at least this many documents at the input of a curation stage must keep one: a
    # stage that drops all of them is blocked (a sentence rule that reads only Latin terminators, a
    # language ID that does not know the language, an oracle that scores one script). Languages below
    # it are too few to tell a broken rule from chance. 0 turns the check off.
    min_language_documents: int = 20

    def __post_init__(self) -> None:
        shares = {f"max_drop_share.{reason}": share for reason, share in self.max_drop_share.items()}
        for source, bounds in self.max_drop_share_by_source.items():
            shares |= {
                f"max_drop_share_by_source.{source}.{reason}": share for reason, share in bounds.items()
            }
        shares |= {
            "min_duplicate_share": self.min_duplicate_share,
            "max_duplicate_share": self.max_duplicate_share,
        }
        shares |= {"min_head_f1": self.min_head_f1, "max_share_error": self.max_share_error}
        for where, share in shares.items():
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"checks.{where} must lie between 0 and 1, got {share}")
        if self.min_duplicate_share > self.max_duplicate_share:
            raise ValueError(
                f"checks.min_duplicate_share {self.min_duplicate_share} is above "
                f"max_duplicate_share {self.max_duplicate_share}"
            )
        if not 0.0 < self.loss_window_fraction <= 0.5:
            raise ValueError(
                f"checks.loss_window_fraction must be in (0, 0.5], got {self.loss_window_fraction}"
            )
        if self.min_language_documents < 0:
            raise ValueError(
                f"checks.min_language_documents must not be negative, got {self.min_language_documents}"
            )
        if self.max_expert_load_over_mean < 1.0:
            raise ValueError(
                f"checks.max_expert_load_over_mean must be at least 1 (perfect balance), "
                f"got {self.max_expert_load_over_mean}"
            )

    def drop_bound(self, source: str, reason: str) -> float:
        own = self.max_drop_share_by_source.get(source, {})
        default = own.get(ANY_REASON, self.max_drop_share.get(ANY_REASON, DEFAULT_MAX_DROP_SHARE))
        return own.get(reason, self.max_drop_share.get(reason, default))


# Where each stage's filter settings live in the pipeline config, and the filter modules whose
# REASON_SETTINGS name, per reason code, the field of that section (or of the source) governing it.
_STAGE_SETTINGS: dict[str, tuple[str, dict[str, ModuleType]]] = {
    "prefiltered": (
        "prefilter",
        {
            "size": size,
            "language": language,
            "gopher_repetition": gopher_repetition,
            "gopher_quality": gopher_quality,
            "c4": c4,
            "fineweb": fineweb,
            "code": code,
            "perplexity": perplexity,
        },
    ),
    "toxicity_filtered": ("toxicity", {"": toxicity}),
}


@dataclass(frozen=True)
class ReasonSetting:
    """The per-source config key that governs a drop reason, its value for the source, and the kinds whose
    defaults set it looser, each with its value there (None: that kind does not run the rule)."""

    key: str
    value: Any
    looser_kinds: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.key} = {self.value!r}"


def reason_settings(
    stage: str, settings: Any, source_config: Any, kind_settings: Mapping[str, Any] | None = None
) -> dict[str, ReasonSetting]:
    """Per reason code of `stage`, the per-source key that governs it ("sources[b].prefilter.gopher_quality
    .min_words"), its value for the source, and the kinds that set it looser. `settings`: the stage's
    config section as that source gets it; `source_config`: the source's; `kind_settings`: per other kind,
    the section the source would get with that kind. Reasons no setting governs are absent."""
    if stage not in _STAGE_SETTINGS:
        return {}
    section, families = _STAGE_SETTINGS[stage]
    source = source_config.name
    found = {}
    for family, module in families.items():
        for reason, path in module.REASON_SETTINGS.items():
            if path is None:
                continue
            if path.startswith("sources."):
                field_name = path.removeprefix("sources.")
                found[reason] = ReasonSetting(
                    f"sources[{source}].{field_name}", getattr(source_config, field_name)
                )
                continue
            value = _setting(getattr(settings, family) if family else settings, path)
            key = ".".join(part for part in (f"sources[{source}]", section, family, path) if part)
            looser = {
                kind: None
                if family and family not in other.families
                else _setting(getattr(other, family), path)
                for kind, other in (kind_settings or {}).items()
            }
            # the loosest first: a kind that does not run the rule, then the furthest value
            loosest = sorted(
                (kind for kind, other in looser.items() if _looser(path, value, other)),
                key=lambda kind: (looser[kind] is not None, _distance(value, looser[kind])),
            )
            found[reason] = ReasonSetting(key, value, {kind: looser[kind] for kind in loosest})
    return found


def _looser(path: str, value: Any, other: Any) -> bool:
    """Whether `other` lets more documents through than `value` for the setting at `path` (None: off)."""
    if value is None or value is False or other == value:
        return False
    if other is None or other is False:
        return True
    bound = next((part for part in path.split(".") if part.startswith(("min_", "max_"))), "")
    if isinstance(value, bool) or not bound:
        return False
    return other < value if bound.startswith("min_") else other > value


def _distance(value: Any, other: Any) -> float:
    """How far a looser `other` lies from `value`, negated so that sorting puts the furthest first."""
    return -abs(float(other) - float(value)) if isinstance(other, int | float) else 0.0


def _setting(config: Any, path: str) -> Any:
    """The value at a dotted path of a config dataclass; a mapping's keys may be ints ("max_top.2")."""
    for part in path.split("."):
        if isinstance(config, Mapping):
            config = config.get(int(part) if part.isdigit() else part)
        else:
            config = getattr(config, part)
    return config


def _governed(reason: str, settings: Mapping[str, ReasonSetting] | None) -> str:
    return f" ({settings[reason]})" if settings and reason in settings else ""


def _to_keep_more(setting: ReasonSetting) -> str:
    """What lets more of a source through a rule: the kind whose defaults loosen it (with its value, also
    suggested for the source alone), else the source's own key."""
    if setting.looser_kinds:
        kind, value = next(iter(setting.looser_kinds.items()))
        if value is None:
            return f"kind: {kind}, whose defaults do not run this rule"
        return (
            f"kind: {kind}, whose defaults set it to {value!r}, or {setting.key}: {value!r} for this "
            "source alone"
        )
    bound = next((part for part in setting.key.split(".") if part.startswith(("min_", "max_"))), "")
    verb = "lower" if bound.startswith("min_") else "raise" if bound.startswith("max_") else "change"
    return f"{verb} {setting.key} ({setting.value!r} now) for this source"


def drop_share_violations(
    stage: str,
    source: str,
    reasons: Mapping[str, int],
    rows_in: int,
    config: ChecksConfig,
    settings: Mapping[str, ReasonSetting] | None = None,
) -> list[str]:
    """One sentence per drop reason whose share of the stage's input is above its bound; `settings`
    (`reason_settings`) names the per-source key that governs the reason, its value, and what keeps more
    (a kind whose defaults do, else the key), and the bound that would pass these drops."""
    found = []
    for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        share, bound = count / rows_in if rows_in else 0.0, config.drop_bound(source, reason)
        if share > bound:
            own_bound = f"checks.max_drop_share_by_source.{source}.{reason}"
            setting = (settings or {}).get(reason)
            keep_more = f" To keep more: {_to_keep_more(setting)};" if setting else ""
            found.append(
                f"{stage}[{source}]: reason {reason!r}{_governed(reason, settings)} dropped {count} of "
                f"{rows_in} documents ({share:.1%}), above its bound {bound:.1%} (checks.max_drop_share, "
                f"or {own_bound}).{keep_more} if these drops are right: {own_bound}: "
                f"{math.floor(share * 100 + 1) / 100:g}"
            )
    return found


def emptied_source(
    stage: str,
    source: str,
    reasons: Mapping[str, int],
    rows_in: int,
    kept: int,
    settings: Mapping[str, ReasonSetting] | None = None,
) -> str | None:
    """A sentence naming the stage and the top reasons, each with the per-source key that governs it and
    its value (`settings`, from `reason_settings`), and what keeps the source, when a source with input
    kept nothing, else None."""
    if rows_in == 0 or kept > 0:
        return None
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    named = (
        ", ".join(f"{reason} {count}{_governed(reason, settings)}" for reason, count in top)
        or "no reason recorded"
    )
    first = (settings or {}).get(top[0][0]) if top else None
    keep = f"{_to_keep_more(first)}; or" if first else "loosen the rules that dropped it for this source, or"
    return (
        f"source {source!r} lost every document at {stage} ({rows_in} in; top reasons: {named}). The "
        f"pipeline stops here rather than train a mixture without it. To keep it: {keep} remove {source!r} "
        "from sources"
    )


def lost_languages(
    stage: str, source: str, by_language: Mapping[str, tuple[int, int]], config: ChecksConfig
) -> list[str]:
    """One sentence per language that reached `stage` with at least checks.min_language_documents
    documents and kept none; `by_language` maps a language to (documents in, documents kept)."""
    floor = config.min_language_documents
    if floor == 0:
        return []
    return [
        f"{stage}[{source}]: language {language!r} lost all of its {rows_in} documents "
        f"(checks.min_language_documents {floor}): look at the stage's drop reasons for it, e.g. "
        f"SELECT reason, count(*) FROM {stage} WHERE language = '{language}' AND NOT keep GROUP BY reason"
        for language, (rows_in, kept) in sorted(by_language.items())
        if rows_in >= floor and kept == 0
    ]


def untrained_sources(shares: Mapping[str, Mapping[str, Any]], weights: Mapping[str, float]) -> list[str]:
    """One sentence per source with a non-zero mixture weight that got no training tokens."""
    return [
        f"source {source!r} has mixture weight {weights[source]:g} but got no training tokens "
        f"({figures['train_documents']} training and {figures['heldout_documents']} held-out documents): "
        "its share went to the other sources. Lower mixture.heldout_max_share, or loosen the curation "
        "rules that left it this small"
        for source, figures in sorted(shares.items())
        if weights.get(source, 0.0) > 0 and figures["tokens"] == 0
    ]


def duplicate_share_violation(source: str, rows_in: int, duplicates: int, config: ChecksConfig) -> str | None:
    """A sentence when the share of `source` removed as duplicates lies outside the configured bounds."""
    if rows_in == 0:
        return None
    share = duplicates / rows_in
    low, high = config.min_duplicate_share, config.max_duplicate_share
    if low <= share <= high:
        return None
    return (
        f"deduplicated[{source}]: {duplicates} of {rows_in} documents removed as duplicates ({share:.1%}), "
        f"outside [{low:.1%}, {high:.1%}] (checks.min_duplicate_share, checks.max_duplicate_share)"
    )


def head_agreement_violations(metrics: Mapping[str, float], config: ChecksConfig) -> list[str]:
    """One sentence per head whose pooled held-out keep F1 against the oracle is under the floor."""
    found = []
    for head in ("probe", "judge"):
        f1 = metrics.get(f"{head}_f1")
        if f1 is None or not math.isfinite(f1) or f1 < config.min_head_f1:
            found.append(
                f"{head} head: keep-decision F1 vs the oracle {f1} on held-out labels, under "
                f"checks.min_head_f1 {config.min_head_f1}"
            )
    return found


def share_error_violations(shares: Mapping[str, Mapping[str, Any]], config: ChecksConfig) -> list[str]:
    """One sentence per source whose achieved token share misses its target by more than the tolerance."""
    found = []
    for source, figures in sorted(shares.items()):
        error = abs(figures["achieved_share"] - figures["target_share"])
        if error > config.max_share_error:
            found.append(
                f"source {source!r}: achieved share {figures['achieved_share']:.4f} against target "
                f"{figures['target_share']:.4f} (error {error:.4f} > checks.max_share_error "
                f"{config.max_share_error}); sources[{source}].mixture_weight sets the target"
            )
    return found


def epoch_cap_shortfalls(shares: Mapping[str, Mapping[str, Any]], max_epochs: float) -> list[str]:
    """One sentence per source that reached its epoch cap while the others went on, so its share fell short
    (the mixture report's `short`)."""
    return [
        f"tokenized_mixture: source {source!r} is at its cap of {max_epochs:g} epochs and trains at "
        f"{figures['achieved_share']:.4f} of the mixture against its target {figures['target_share']:.4f}: "
        f"raise mixture.max_epochs, lower sources[{source}].mixture_weight, or give the source more documents"
        for source, figures in sorted(shares.items())
        if figures["short"]
    ]


def calibration_shortfalls(
    thresholds: Mapping[str, Mapping[str, Any]], keep_rates: Mapping[str, float], tolerance: float, z: float
) -> list[str]:
    """`calibration_shortfall` for each source with a keep rate; `thresholds`: per source, its calibrated
    thresholds as stored (n_calibration, n_needed), absent where it had no unseen documents."""
    found = []
    for source, keep_rate in sorted(keep_rates.items()):
        calibrated = thresholds.get(source, {"n_calibration": 0, "n_needed": 1})
        unseen, needed = calibrated["n_calibration"], calibrated["n_needed"]
        if problem := calibration_shortfall(source, unseen, needed, keep_rate, tolerance, z):
            found.append(problem)
    return found


def calibration_shortfall(
    source: str, unseen: int, needed: int, keep_rate: float, tolerance: float, z: float
) -> str | None:
    """A sentence when `source`'s thresholds were calibrated on fewer unseen documents than the configured
    keep-rate precision (`calibration.keep_rate_tolerance` at `z` sigmas) needs, with the precision they
    give: the tolerance that would accept them."""
    more = "the source needs more documents than the oracle labels (oracle.per_source)"
    if unseen == 0:
        return (
            f"quality_heads[{source}]: no unseen documents to calibrate on, so no thresholds and it cannot "
            f"be scored: {more}"
        )
    if unseen >= needed:
        return None
    margin = z * math.sqrt(keep_rate * (1 - keep_rate) / unseen)
    return (
        f"quality_heads[{source}]: thresholds calibrated on {unseen} unseen documents, fewer than the "
        f"{needed} that a keep rate within calibration.keep_rate_tolerance {tolerance:g} needs (z = {z:g}): "
        f"on new documents its keep rate may be {margin:.3f} off its target; "
        f"calibration.keep_rate_tolerance: {margin:.3f} accepts that, or {more}"
    )


def loss_trend(losses: Sequence[float], config: ChecksConfig) -> tuple[list[str], dict[str, float]]:
    """Whether the training loss is finite and falling: (problems, figures).

    Falling: the mean of the last window of steps lies `min_loss_drop_fraction` (relative) below the
    mean of the first window, each window `loss_window_fraction` of the steps (at least one step)."""
    if not losses:
        return ["the run logged no step"], {}
    bad = [i for i, loss in enumerate(losses) if not math.isfinite(loss)]
    if bad:
        return [f"{len(bad)} non-finite losses, the first at logged step {bad[0] + 1}"], {}
    window = max(1, math.ceil(len(losses) * config.loss_window_fraction))
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    figures = {"first_window_mean": first, "last_window_mean": last, "window_steps": window}
    if len(losses) < 2 * window or last > first * (1.0 - config.min_loss_drop_fraction):
        return [
            f"the loss did not fall: mean {last:.4f} over the last {window} steps against {first:.4f} over "
            f"the first (needs a drop of checks.min_loss_drop_fraction {config.min_loss_drop_fraction:.1%})"
        ], figures
    return [], figures


def router_violations(router: Mapping[str, Any] | None, config: ChecksConfig) -> list[str]:
    """Dead experts and overloaded layers in the last step's router record (`training/health.py`)."""
    if router is None:
        return []
    found = []
    for layer, dead, ratio in zip(
        router["layers"], router["dead_experts"], router["max_over_mean"], strict=True
    ):
        if dead:
            found.append(f"layer {layer}: {dead} dead experts (no token in the health window)")
        if ratio > config.max_expert_load_over_mean:
            found.append(
                f"layer {layer}: max expert load {ratio:.2f}x the mean, above "
                f"checks.max_expert_load_over_mean {config.max_expert_load_over_mean}"
            )
    return found


def ingest_reconciliation(source: str, records: int, documents: int, quarantined: int) -> list[str]:
    """A sentence when the records read from `source`'s shards are not its documents plus quarantine rows."""
    if records == documents + quarantined:
        return []
    return [
        f"raw_documents[{source}]: the shards held {records} records but ingest wrote {documents} documents "
        f"+ {quarantined} quarantined = {documents + quarantined}"
    ]


def stage_reconciliation(
    stage: str,
    source: str,
    upstream: str,
    *,
    counted: tuple[int, int, int],
    in_files: tuple[int, int],
    upstream_kept: int,
) -> list[str]:
    """One sentence per count of a filter stage that disagrees with another: `counted` is (rows in, kept,
    dropped) from its completion records, `in_files` (rows, kept) from its parquet files, `upstream_kept`
    the kept rows of `upstream`'s parquet files (what the stage should have received)."""
    rows_in, kept, dropped = counted
    file_rows, file_kept = in_files
    where = f"{stage}[{source}]"
    found = []
    if rows_in != kept + dropped:
        found.append(f"{where}: {rows_in} rows in but {kept} kept + {dropped} dropped = {kept + dropped}")
    if rows_in != upstream_kept:
        found.append(f"{where}: {rows_in} rows in but {upstream} kept {upstream_kept}")
    if rows_in != file_rows:
        found.append(f"{where}: its completion records count {rows_in} rows in, its files {file_rows}")
    if kept != file_kept:
        found.append(f"{where}: its completion records count {kept} kept, its files {file_kept}")
    return found


def keep_rate_violation(source: str, kept: int, rows_in: int, target: float, tolerance: float) -> str | None:
    """A sentence when the share scoring kept of `source` lies further than `tolerance` from its target."""
    rate = kept / rows_in if rows_in else 0.0
    if abs(rate - target) <= tolerance:
        return None
    return (
        f"scored_documents[{source}]: kept {kept} of {rows_in} documents ({rate:.4f}), "
        f"{abs(rate - target):.4f} from its target keep rate {target} (sources[{source}].keep_rate), "
        f"beyond calibration.keep_rate_tolerance {tolerance}"
    )


def oracle_failure_violation(failed: int, requested: int, bound: float) -> str | None:
    """A sentence when the oracle left more of the sample unlabelled than `oracle.max_failure_rate`."""
    rate = failed / requested if requested else 0.0
    if rate <= bound:
        return None
    return (
        f"oracle_labels: {failed} of {requested} sampled documents left unlabelled ({rate:.1%}), above "
        f"oracle.max_failure_rate {bound:.1%}; each one's error: SELECT error FROM oracle_label_failures"
    )


def cluster_row_violation(signatures: int, rows: int, distinct_ids: int) -> str | None:
    """A sentence unless the clusters hold exactly one row per signed document."""
    if signatures == rows == distinct_ids:
        return None
    return (
        f"dedup_clusters: {signatures} documents signed but the clusters hold {rows} rows of "
        f"{distinct_ids} distinct ids; each signed document needs exactly one row"
    )


def stale_deduplicated(built: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """One sentence per source whose `deduplicated` was built from clusters other than the current ones;
    `built` and `current` map a source to a clusters version."""
    return [
        f"deduplicated[{source}] was built from clusters version {version} but the current one is "
        f"{current[source]}: materialise deduplicated[{source}] again"
        for source, version in sorted(built.items())
        if version != current[source]
    ]
