"""The curated mixture from the lake: the tokenizer and the held-out cuts, then token shards and packing.

Two functions, one per asset, that a script or a test calls without Dagster:

- `train_curated_tokenizer`: one streamed pass over each source's kept ids fixes its held-out cut
  (heldout.py), a second streams the training text (kept, not held out, not excluded as the neutral set
  or its copies) into the BPE trainer. The tokenizer and the cuts are written together into the
  tokenizer's folder (`heldout_cuts.json`).
- `build_curated_mixture`: each source's scored shards tokenised per shard (`TokenizeWork`, by the
  engine: Ray tasks, or a plain loop with `workers=0`), split at the stored cuts, then sampled and
  packed by `pack_mixture`. The driver reads no document text: only the token index and the held-out
  rows come back to it.

Why the mixture reads the tokenizer's cuts rather than recomputing them: the kept ids are scanned once,
not twice; and the split is by construction the one the tokenizer was trained around, so if the lake
moved between the two steps no document the tokenizer learnt from can land in the held-out set.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from tokenizers import Tokenizer

from moe_dag.data.atomic import atomic_path
from moe_dag.data.engine import ShardInput, StageRun, StageSpec, upstream_inputs
from moe_dag.data.engine.stages import TokenizeWork
from moe_dag.data.lake import Lake
from moe_dag.data.mixture.build import HELDOUT_SCHEMA, MixtureConfig, pack_mixture
from moe_dag.data.mixture.heldout import heldout_cut, split_at_cut
from moe_dag.data.mixture.neutral import excluded_ids, without_excluded
from moe_dag.data.mixture.token_shards import SourceTokens, TokenShard
from moe_dag.data.schema import kept_rows
from moe_dag.data.tokenizer import (
    TOKENIZER_FILE,
    TokenizerConfig,
    eos_id,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

SCORED_STAGE = "scored_documents"
TOKENIZER_STAGE = "tokenizer"
MIXTURE_STAGE = "tokenized_mixture"
TOKENS_STAGE = "tokenized_mixture/shards"
HELDOUT_STAGE = "tokenized_mixture/heldout"
CUTS_FILE = "heldout_cuts.json"

# Brings one source's slice of a stage up to date: (spec, source, inputs) -> the run. The asset passes
# its Ray resource's `run_stage`; a test passes the engine's `run_stage` with `workers=0`.
StageRunner = Callable[[StageSpec, str, list[ShardInput]], StageRun]


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    path: Path  # the tokenizer.json written
    documents: int  # documents it was trained on
    cuts: dict[str, int | None]  # per source, the held-out cut on the id hash


def kept_training_batches(
    lake: Lake, source: str, columns: list[str], excluded: frozenset[str]
) -> Iterator[pa.Table]:
    """The kept scored documents training may use (`columns` of them): the neutral set and its copies
    left out, held-out documents still in."""
    for batch in lake.iter_batches(SCORED_STAGE, source, columns=[*columns, "keep"]):
        yield without_excluded(kept_rows(batch), excluded)


def heldout_cuts(
    lake: Lake, sources: list[str], config: MixtureConfig, excluded: frozenset[str]
) -> dict[str, int | None]:
    """Per source, the held-out cut on the id hash, from one pass over its kept ids."""

    def ids(name: str) -> Iterator[str]:
        for batch in kept_training_batches(lake, name, ["id"], excluded):
            yield from batch["id"].to_pylist()

    return {
        name: heldout_cut(
            ids(name), config.heldout_fraction, config.heldout_min_documents, config.heldout_max_share
        )
        for name in sources
    }


def train_curated_tokenizer(
    lake: Lake, sources: list[str], mixture: MixtureConfig, config: TokenizerConfig
) -> TrainedTokenizer:
    """A BPE tokenizer on the kept training documents, streamed from the lake; written with the held-out
    cuts into the lake's `tokenizer` folder."""
    excluded = excluded_ids(lake)
    cuts = heldout_cuts(lake, sources, mixture, excluded)
    counted = {"documents": 0}

    def texts() -> Iterator[str]:
        for name in sources:
            for batch in kept_training_batches(lake, name, ["id", "text"], excluded):
                train, _ = split_at_cut(batch, cuts[name])
                counted["documents"] += train.num_rows
                yield from train["text"].to_pylist()

    trained = train_tokenizer(texts(), config)
    with lake.writing_artifact(TOKENIZER_STAGE) as folder:
        path = save_tokenizer(trained, folder)
        with atomic_path(folder / CUTS_FILE) as partial:
            partial.write_text(json.dumps(cuts, indent=2, sort_keys=True) + "\n")
    return TrainedTokenizer(tokenizer=trained, path=path, documents=counted["documents"], cuts=cuts)


def read_heldout_cuts(lake: Lake, sources: list[str]) -> dict[str, int | None]:
    """The cuts the tokenizer was trained around (`train_curated_tokenizer`)."""
    path = lake.artifact_dir(TOKENIZER_STAGE) / CUTS_FILE
    if not path.is_file():
        raise ValueError(f"{path} not found: materialise the tokenizer (it stores the held-out cuts)")
    cuts = json.loads(path.read_text())
    missing = sorted(set(sources) - set(cuts))
    if missing:
        raise ValueError(f"the tokenizer at {path.parent} predates sources {missing}: materialise it again")
    return {name: cuts[name] for name in sources}


def tokenize_curated(
    lake: Lake, sources: list[str], config: MixtureConfig, run: StageRunner
) -> tuple[dict[str, SourceTokens], pa.Table, Tokenizer]:
    """Every source's token shards (tokenised where missing or stale), the held-out documents, and the
    tokenizer."""
    trained = load_tokenizer(lake.artifact_dir(TOKENIZER_STAGE) / TOKENIZER_FILE)
    cuts = read_heldout_cuts(lake, sources)
    excluded = excluded_ids(lake)
    spec = StageSpec(
        outputs=(TOKENS_STAGE, HELDOUT_STAGE),
        make_work=functools.partial(
            TokenizeWork,
            TOKENS_STAGE,
            HELDOUT_STAGE,
            lake.artifact(TOKENIZER_STAGE, TOKENIZER_FILE),  # a local copy on each Ray worker
            config.eos_token,
            cuts,
            excluded,
        ),
        # A retrained tokenizer, or a held-out set that moved, retokenises every shard.
        params=repr(
            (hashlib.sha256(trained.to_str().encode()).hexdigest(), config.eos_token, cuts, sorted(excluded))
        ),
    )
    tokens, heldout = {}, [HELDOUT_SCHEMA.empty_table()]
    for name in sorted(sources):
        stage_run = run(spec, name, upstream_inputs(lake, SCORED_STAGE, name))
        folder = lake.local_slice(TOKENS_STAGE, name)
        tokens[name] = SourceTokens(name, [TokenShard.open(folder, key) for key in stage_run.records])
        heldout.append(lake.read_table(HELDOUT_STAGE, name))
    return tokens, pa.concat_tables(heldout), trained


def build_curated_mixture(
    lake: Lake, sources: list[str], config: MixtureConfig, run: StageRunner
) -> tuple[dict, Path]:
    """Tokenise, sample and pack the curated mixture into the lake's `tokenized_mixture` folder (the
    files build.py documents); returns the report and the folder."""
    tokens, heldout, trained = tokenize_curated(lake, sources, config, run)
    vocab_size = trained.get_vocab_size(with_added_tokens=True)
    eos = eos_id(trained, config.eos_token)
    with lake.writing_artifact(MIXTURE_STAGE) as out_dir:
        report = pack_mixture(tokens, heldout, vocab_size, eos, config, out_dir)
    return report, out_dir
