"""When the stages that learn from the whole curated set run again after new data: the labels (and so
the heads) and the mixture (and so training).

New shards flow through the per-source stages and are scored with the current heads; relabelling and
retraining the heads, or rebuilding the mixture and retraining the proxy, costs far more than the
shard itself. So these stages follow new data only when a source's population moved enough to matter:
its kept documents changed by more than a share since the stage last ran (`refresh` in the config), or
when asked (`moe-dag run --refresh`, or materialising them in the UI). A change of their own code or
config, or of how upstream curates (a filter's settings), still reruns them at once.
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

    def __post_init__(self) -> None:
        for name in ("relabel_after_change", "remix_after_change"):
            if getattr(self, name) < 0:
                raise ValueError(f"refresh.{name} must not be negative, got {getattr(self, name)}")


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
