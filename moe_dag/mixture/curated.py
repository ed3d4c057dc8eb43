"""The curated mixture from the lake: the tokenizer and the held-out cuts, then token shards and packing.

Two functions, one per asset, that a script or a test calls without Dagster:

- `train_curated_tokenizer`: two passes of tasks over each source's kept ids fix its held-out cut
  (heldout.py: counts, then each file's lowest hashes), a third streams the training text (kept, not held
  out, not excluded as the neutral set or its copies) into the BPE trainer, a file at a time: all of it,
  or past `TokenizerConfig.max_training_documents` a sample on the id hash (`sample_tops`), which the
  tasks draw, so the trainer's memory stays bounded as the corpus grows. The tokenizer and the cuts are
  written together into the tokenizer's folder (`heldout_cuts.json`).
- `build_curated_mixture`: each source's scored shards tokenised per shard (`TokenizeWork`, by the
  engine: Ray tasks, or a plain loop with `workers=0`), split at the stored cuts, then sampled and
  packed by `pack_mixture`. The driver reads no document and no index row: tasks return each token
  shard's document lengths, the sampler draws the plan from them here, and tasks on this machine write
  the held-out file and pack the rows from the plan.

Every pass over the scored files runs in tasks (`map_tasks`, `iter_tasks`; in this process without Ray),
and the ids no training may see are read by those tasks (`Exclusions`), not here.

Why the mixture reads the tokenizer's cuts rather than recomputing them: the kept ids are scanned once,
not twice; and the split is by construction the one the tokenizer was trained around, so if the lake
moved between the two steps no document the tokenizer learnt from can land in the held-out set.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from moe_dag.engine import ShardInput, StageRun, StageSpec, upstream_inputs
from moe_dag.engine.tasks import iter_tasks, map_tasks
from moe_dag.mixture.build import HeldoutSlices, MixtureConfig, pack_mixture
from moe_dag.mixture.heldout import cut_of_lowest, heldout_count, lowest_hashes, split_at_cut
from moe_dag.mixture.neutral import Exclusions, without_excluded
from moe_dag.mixture.token_shards import SourceIndex
from moe_dag.mixture.tokenizer import (
    TOKENIZER_FILE,
    TokenizerConfig,
    eos_id,
    load_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)
from moe_dag.mixture.work import TokenizeWork
from moe_dag.storage.atomic import atomic_path
from moe_dag.storage.lake import Lake, read_batches
from moe_dag.storage.schema import kept_rows

SCORED_STAGE = "scored_documents"
TOKENIZER_STAGE = "tokenizer"
MIXTURE_STAGE = "tokenized_mixture"
TOKENS_STAGE = "tokenized_mixture/shards"
HELDOUT_STAGE = "tokenized_mixture/heldout"
CUTS_FILE = "heldout_cuts.json"
# The largest id hash (`stable_hash` is 64 bits): the top of a source's training hashes.
_MAX_HASH = (1 << 64) - 1

# Brings one source's slice of a stage up to date: (spec, source, inputs) -> the run. The asset passes
# its Ray resource's `run_stage`; a test passes the engine's `run_stage` with `workers=0`.
StageRunner = Callable[[StageSpec, str, list[ShardInput]], StageRun]


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    path: Path  # the tokenizer.json written
    documents: int  # documents it was trained on
    available: int  # training documents it could have learnt from (more than `documents` when sampled)
    cuts: dict[str, int | None]  # per source, the held-out cut on the id hash


def heldout_cuts(
    lake: Lake, sources: list[str], config: MixtureConfig, excluded: Exclusions
) -> tuple[dict[str, int | None], dict[str, int]]:
    """Per source, the held-out cut on the id hash and the count of training documents (usable, not
    held out), from two passes of tasks over its kept ids: each file's count of usable documents, then
    each file's lowest hashes, as many as the source holds out. Only counts and those hashes (8 bytes a
    held-out document) come back here."""
    files = _scored_files(lake, sources)
    counts = Counter()
    for (name, _), count in zip(
        files, map_tasks(functools.partial(_usable_count, lake.url, excluded), files), strict=True
    ):
        counts[name] += count
    wanted = {
        name: heldout_count(
            counts[name], config.heldout_fraction, config.heldout_min_documents, config.heldout_max_share
        )
        for name in sources
    }
    lowest = map_tasks(functools.partial(_lowest_hashes, lake.url, excluded, wanted), files)
    cuts = {
        name: cut_of_lowest(
            [part for (source, _), part in zip(files, lowest, strict=True) if source == name], wanted[name]
        )
        for name in sources
    }
    return cuts, {name: counts[name] - wanted[name] for name in sources}


def sample_tops(
    cuts: dict[str, int | None], training: dict[str, int], max_documents: int
) -> dict[str, int | None]:
    """Per source, the largest id hash the tokenizer trains on (None: every training document).

    Within the `max_documents` when the sources' `training` documents number no more; otherwise each
    source trains on its documents whose hash lies in the same share of its training hashes, just above
    its held-out cut: about `max_documents` in all, each source in its own proportion. The hash is
    uniform, so that is a uniform sample of each source, drawn from ids alone: the same on every run and
    machine, whatever the files, and a task keeps a document by its id without seeing the others."""
    total = sum(training.values())
    if total <= max_documents:
        return dict.fromkeys(cuts)
    share = max_documents / total
    tops = {}
    for name, cut in cuts.items():
        low = -1 if cut is None else cut  # training hashes lie in (low, _MAX_HASH]
        tops[name] = low + int(share * (_MAX_HASH - low))
    return tops


def train_curated_tokenizer(
    lake: Lake, sources: list[str], mixture: MixtureConfig, config: TokenizerConfig
) -> TrainedTokenizer:
    """A BPE tokenizer on the kept training documents, written with the held-out cuts into the lake's
    `tokenizer` folder. Tasks read the scored files; the training text reaches the trainer here one file
    at a time, in the sources' and files' order (`iter_tasks`), so this process never holds a source.
    With `config.from_`, that pretrained tokenizer is written instead, trained on nothing (the cuts are
    still the mixture's)."""
    excluded = Exclusions(lake.url)
    cuts, training = heldout_cuts(lake, sources, mixture, excluded)
    tops = sample_tops(cuts, training, config.max_training_documents)
    counted = {"documents": 0}

    def texts() -> Iterator[str]:
        for file_texts in iter_tasks(
            functools.partial(_training_texts, lake.url, excluded, cuts, tops), _scored_files(lake, sources)
        ):
            counted["documents"] += len(file_texts)
            yield from file_texts

    trained = load_pretrained_tokenizer(config.from_) if config.from_ else train_tokenizer(texts(), config)
    with lake.writing_artifact(TOKENIZER_STAGE) as folder:
        path = save_tokenizer(trained, folder)
        with atomic_path(folder / CUTS_FILE) as partial:
            partial.write_text(json.dumps(cuts, indent=2, sort_keys=True) + "\n")
    return TrainedTokenizer(
        tokenizer=trained,
        path=path,
        documents=counted["documents"],
        available=sum(training.values()),
        cuts=cuts,
    )


def _scored_files(lake: Lake, sources: list[str]) -> list[tuple[str, str]]:
    """(source, path) of every scored file of `sources`, in order."""
    files = []
    for name in sources:
        paths = lake.parquet_files(SCORED_STAGE, name)
        if not paths:
            raise FileNotFoundError(f"{SCORED_STAGE} for source {name!r} has not been materialised yet")
        files += [(name, path) for path in paths]
    return files


def _usable_batches(lake_url: str, excluded: Exclusions, path: str, columns: list[str]) -> Iterator[pa.Table]:
    """The kept scored documents of one file training may use (`columns` of them): the neutral set and its
    copies left out, held-out documents still in."""
    for batch in read_batches(path, Lake(lake_url).fs, columns=[*columns, "keep"]):
        yield without_excluded(kept_rows(batch), excluded)


def _usable_count(lake_url: str, excluded: Exclusions, file: tuple[str, str]) -> int:
    return sum(batch.num_rows for batch in _usable_batches(lake_url, excluded, file[1], ["id"]))


def _lowest_hashes(
    lake_url: str, excluded: Exclusions, wanted: dict[str, int], file: tuple[str, str]
) -> np.ndarray:
    source, path = file
    ids = (
        doc_id
        for batch in _usable_batches(lake_url, excluded, path, ["id"])
        for doc_id in batch["id"].to_pylist()
    )
    return lowest_hashes(ids, wanted[source])


def _training_texts(
    lake_url: str,
    excluded: Exclusions,
    cuts: dict[str, int | None],
    tops: dict[str, int | None],
    file: tuple[str, str],
) -> list[str]:
    """The text of one file's training documents the tokenizer learns from: hash above the held-out cut
    and, when sampled, at most the source's top (`sample_tops`)."""
    source, path = file
    texts = []
    for batch in _usable_batches(lake_url, excluded, path, ["id", "text"]):
        training = split_at_cut(batch, cuts[source])[0]
        if tops[source] is not None:
            training = split_at_cut(training, tops[source])[1]  # the "held" side: hash <= top
        texts += training["text"].to_pylist()
    return texts


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
) -> tuple[dict[str, SourceIndex], HeldoutSlices, Tokenizer]:
    """Every source's token shards (tokenised where missing or stale) as their index, the held-out
    documents as lake slices, and the tokenizer: what `pack_mixture` packs in tasks."""
    trained = load_tokenizer(lake.artifact_dir(TOKENIZER_STAGE) / TOKENIZER_FILE)
    cuts = read_heldout_cuts(lake, sources)
    excluded = Exclusions(lake.url)  # each actor reads the ids itself
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
            (hashlib.sha256(trained.to_str().encode()).hexdigest(), config.eos_token, cuts, excluded.digest())
        ),
        warm=True,  # the tokenizer loads once per worker process, and its word cache stays warm
    )
    keys = {
        name: list(run(spec, name, upstream_inputs(lake, SCORED_STAGE, name)).records)
        for name in sorted(sources)
    }
    tokens = SourceIndex.gather(lake, TOKENS_STAGE, keys)
    return tokens, HeldoutSlices(lake.url, HELDOUT_STAGE, tuple(sorted(sources))), trained


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
