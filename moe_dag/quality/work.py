"""The shard work of `scored_documents`: the probe, then the judge, over a shard's Arrow batches."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

from moe_dag.engine.shards import ShardInput
from moe_dag.engine.stage import ShardOutput, ShardWork, decision_counts, kept_batches, merge_counts


class ScoringWork(ShardWork):
    """scored_documents: the probe, then the judge for documents the probe lets through. Holds the
    backbone and the heads, so it runs in an actor pool (one GPU per actor in production).

    Rows of the shard's previous output that the current heads already scored are reused and only
    decided again (new thresholds do not need the backbone); the rest are scored.

    Splittable: a block's batches are the whole shard's batches over the same rows (blocks.py), so
    the backbone sees the same padded batches and gives the same scores."""

    splittable = True

    def __init__(self, heads_dir: str | os.PathLike[str], source: str) -> None:
        from moe_dag.quality.heads import load_heads

        self.stored = load_heads(heads_dir)
        self.thresholds = self.stored.thresholds[source]

    @property
    def backbone(self) -> Any:
        # torch and transformers load only in the processes that score, and only when a row needs it;
        # not kept here, so a work kept by its process (warm.py) holds no backbone but the current one.
        return shared_backbone(self.stored.backbone_config)

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        from moe_dag.quality.scoring import (
            decision_changes,
            early_exit_summary,
            score_documents,
            split_reusable,
        )

        previous_path = out.lake.shard_path("scored_documents", out.source, shard.key)
        previous = out.lake.read_file(previous_path) if out.lake.fs.exists(previous_path) else None
        writer = out.table("scored_documents")
        counts = []
        batch_size = self.stored.backbone_config.batch_size
        for batch in kept_batches(shard, out):
            reused, todo = split_reusable(batch, previous, self.stored.version, self.thresholds)
            parts = [] if reused is None else [reused]
            if todo.num_rows:
                parts.append(
                    score_documents(todo, self.backbone, self.stored.heads, self.thresholds, batch_size)
                )
            if not parts:
                continue
            scored = pa.concat_tables(parts, promote_options="permissive")
            writer.write(scored)
            exits = early_exit_summary(scored, self.stored.backbone_config)
            counts.append(
                {
                    **decision_counts(scored),
                    # Rates weighted by documents, so they add up over batches and shards.
                    "early_exits": round(exits["early_exit_rate"] * scored.num_rows),
                    "kept_at_probe": round(exits["keep_exit_rate"] * scored.num_rows),
                    "layer_compute_saved": exits["layer_compute_saved"] * scored.num_rows,
                    **decision_changes(previous, scored, self.stored.version),
                }
            )
        return merge_counts(counts)


_BACKBONE: dict[str, Any] = {}


def shared_backbone(config: Any) -> Any:
    """The backbone of `config` (a `BackboneConfig`), loaded once per process: the scoring works of
    every source (one per source, for its thresholds) share it. One is kept, the last asked for."""
    key = repr(config)
    if key not in _BACKBONE:
        from moe_dag.quality.heads import load_backbone

        _BACKBONE.clear()  # before loading, so that two are never held at once
        _BACKBONE[key] = load_backbone(config)
    return _BACKBONE[key]
