"""The shard work of `tokenized_mixture`: token shards for training and held-out rows for evaluation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from moe_dag.engine.shards import ShardInput
from moe_dag.engine.stage import ShardOutput, ShardWork, kept_batches
from moe_dag.mixture.build import HELDOUT_SCHEMA, heldout_table
from moe_dag.mixture.heldout import split_at_cut
from moe_dag.mixture.neutral import Exclusions, without_excluded
from moe_dag.mixture.token_shards import TokenShardWriter
from moe_dag.mixture.tokenizer import eos_id, load_tokenizer


class TokenizeWork(ShardWork):
    """Token shards of the kept scored documents: `<key>.bin` + `<key>.index.parquet` under
    `tokens_stage` for training, `<key>.parquet` under `heldout_stage` for evaluation. Each source's
    held-out cut (see heldout.py) is computed once from its ids, so the split is the same whatever the
    shards."""

    def __init__(
        self,
        tokens_stage: str,
        heldout_stage: str,
        tokenizer_path: str | os.PathLike[str],  # a LakeArtifact on an object-store lake
        eos_token: str,
        heldout_cuts: dict[str, int | None],
        # The neutral set and its copies (neutral.py): read by the worker from the lake, once a process.
        excluded_ids: Exclusions | frozenset[str] = frozenset(),
    ) -> None:
        self.tokens_stage, self.heldout_stage = tokens_stage, heldout_stage
        self.tokenizer = load_tokenizer(Path(tokenizer_path))
        self.eos = eos_id(self.tokenizer, eos_token)
        self.heldout_cuts = heldout_cuts
        self.excluded_ids = excluded_ids

    def process(self, shard: ShardInput, out: ShardOutput) -> dict[str, Any]:
        token_writer = TokenShardWriter(
            self.tokenizer,
            self.eos,
            out.local_path(self.tokens_stage, ".bin"),
            out.local_path(self.tokens_stage, ".index.parquet"),
        )
        heldout = out.table(self.heldout_stage, HELDOUT_SCHEMA)
        documents = held = 0
        with token_writer:
            for batch in kept_batches(shard, out):
                usable = without_excluded(batch, self.excluded_ids)
                train, held_rows = split_at_cut(usable, self.heldout_cuts[out.source])
                token_writer.write(train)
                heldout.write(heldout_table(held_rows, self.tokenizer, self.eos, out.source))
                documents += batch.num_rows
                held += held_rows.num_rows
        return {"documents": documents, "heldout": held, "tokens": token_writer.tokens}
