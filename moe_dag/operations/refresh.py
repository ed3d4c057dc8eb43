"""When the stages that learn from the whole curated set run again after new data: the labels (and so
the heads) and the mixture (and so training).

New shards flow through the per-source stages and are scored with the current heads; relabelling and
retraining the heads, or rebuilding the mixture and retraining the proxy, costs far more than the
shard itself. So these stages follow new data only when a source's population moved enough to matter:
its kept documents changed by more than a share since the stage last ran (`refresh` in the config), or
when asked (`moe-dag run --refresh`, or materialising them in the UI). A change of their own code or
config, or of how upstream curates (a filter's settings), still reruns them at once.

Relabelling retrains the heads, which rescores every source and may change old decisions: a run that
the relabelling policy would turn into that waits for the user (`moe-dag run --refresh`, or
`refresh.relabel_without_asking`) and says what it would redo; meanwhile new documents are scored by the
current heads and old decisions stay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(kw_only=True)
class RefreshConfig:
    # Oracle sample, labels and heads: drawn again when some source's kept documents at
    # toxicity_filtered moved by more than this share since the last labelling (0: on any new document).
    relabel_after_change: float = 0.2
    # Tokenizer, mixture, evaluation sets and the proxies: rebuilt when some source's kept documents at
    # scored_documents moved by more than this share since the last build. The evaluation sets follow
    # with the mixture, so a new shard's neutral documents do not re-evaluate an unchanged proxy.
    remix_after_change: float = 0.1
    # Relabel when the policy above says so without waiting for `moe-dag run --refresh` (true: an
    # unattended pipeline, where old decisions may change on any run).
    relabel_without_asking: bool = False

    def __post_init__(self) -> None:
        for name in ("relabel_after_change", "remix_after_change"):
            if getattr(self, name) < 0:
                raise ValueError(f"refresh.{name} must not be negative, got {getattr(self, name)}")

    def asks_first(self, refresh: Refresh) -> bool:
        """Whether the policy's refresh waits for the user: relabelling, which rescores every source."""
        return refresh.threshold == "relabel_after_change" and not self.relabel_without_asking


@dataclass(frozen=True)
class Refresh:
    """What an on-demand asset's policy watches: the kept documents per source of `population` (a
    per-source upstream asset), against the share in the `threshold` field of the config's `refresh`."""

    population: str
    threshold: str


def moved_sources(then: Mapping[str, int], now: Mapping[str, int], share: float) -> list[str]:
    """Sources whose kept documents moved by more than `share` of what they were (a new source or one
    that had none counts as moved), each described with its two counts."""
    moved = []
    for source in sorted(set(then) | set(now)):
        before, after = then.get(source, 0), now.get(source, 0)
        if (before == 0 and after > 0) or (before > 0 and abs(after - before) / before > share):
            moved.append(f"{source} {before} -> {after}")
    return moved


def refresh_waiting(asset: str, why: str, redo: list[str], scored: Mapping[str, int]) -> str:
    """What `moe-dag run` says instead of relabelling on its own: `why` the policy would refresh `asset`,
    what going ahead redoes (`redo`, in order), and how many old decisions may change: at most every
    document scored now (`scored`, per source)."""
    per_source = ", ".join(f"{source} {count}" for source, count in sorted(scored.items()))
    total = sum(scored.values())
    estimate = (
        f"up to {total} old scoring decisions may change (the documents scored now: {per_source})"
        if scored
        else "no document is scored yet"
    )
    return (
        f"{asset}: waiting for --refresh: {why}. Going ahead redoes {', '.join(redo)}; {estimate}. "
        "To go ahead: moe-dag run --refresh (or refresh.relabel_without_asking: true); until then the new "
        "documents are scored by the current heads and old decisions stay"
    )
