"""tokenizer and tokenized_mixture: a BPE tokenizer on the kept training documents, then packed token
sequences and the held-out documents.

Tokenisation fans out like the per-source stages: one token shard per scored shard, in parallel on Ray,
each with a completion record, so a rerun tokenises only new or changed shards. Sampling and packing
then run here, over memory-mapped token shards. Which documents are held out is decided once per source
from its ids (`heldout_cut`), so the tokenizer and the token shards agree on it.
"""

import functools
import hashlib
from collections.abc import Iterator

import dagster as dg
import pyarrow as pa
from tokenizers import Tokenizer

from moe_dag.assets.bounds import share_error_violations, untrained_sources
from moe_dag.assets.operating import operated
from moe_dag.assets.plots import bars_png, png_markdown
from moe_dag.assets.refresh import Refresh
from moe_dag.assets.reporting import problems_result
from moe_dag.data.engine import StageSpec, upstream_inputs
from moe_dag.data.engine.stages import TokenizeWork
from moe_dag.data.mixture import SourceTokens, TokenShard, pack_mixture
from moe_dag.data.mixture.build import HELDOUT_SCHEMA
from moe_dag.data.mixture.heldout import heldout_cut, split_at_cut
from moe_dag.data.mixture.neutral import excluded_ids, without_excluded
from moe_dag.data.schema import kept_rows
from moe_dag.data.tokenizer import eos_id, load_tokenizer, save_tokenizer, train_tokenizer
from moe_dag.orchestration.resources import PipelineResource, RayResource

TOKENIZER_FILE = "tokenizer.json"
TOKENS_STAGE = "tokenized_mixture/shards"
HELDOUT_STAGE = "tokenized_mixture/heldout"
WEIGHTED_SOURCES_TRAINED = "weighted_sources_trained"
# The mixture follows new scored documents when some source's kept documents moved past a share.
REMIX = Refresh(population="scored_documents", threshold="refresh.remix_after_change")


@dg.asset(
    group_name="training",
    kinds={"huggingface"},
    deps=["scored_documents", "neutral_documents"],
    # the held-out cut comes from the mixture config
    metadata=operated(1, "tokenizer", "mixture", refresh=REMIX),
)
def tokenizer(pipeline: PipelineResource) -> dg.MaterializeResult:
    """A byte-level BPE tokenizer trained on the kept documents of training, streamed from the lake: the
    documents held out for evaluation (the mixture's cut, and the neutral set with its copies) never
    reach it."""
    lake = pipeline.lake
    cuts = _heldout_cuts(pipeline)
    counted = {"documents": 0}

    def texts() -> Iterator[str]:
        for name in pipeline.config.source_names:
            for batch in _kept_batches(pipeline, name, ["id", "text", "keep"]):
                train, _ = split_at_cut(batch, cuts[name])
                counted["documents"] += train.num_rows
                yield from train["text"].to_pylist()

    trained = train_tokenizer(texts(), pipeline.config.tokenizer)
    with lake.writing_artifact("tokenizer") as folder:
        path = save_tokenizer(trained, folder / TOKENIZER_FILE)
    return dg.MaterializeResult(
        metadata={
            "vocab_size": trained.get_vocab_size(),
            "training_documents": counted["documents"],
            "path": dg.MetadataValue.path(str(path)),
        }
    )


def _tokenize_sources(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource, trained: Tokenizer
) -> tuple[dict[str, SourceTokens], pa.Table]:
    """Every source's token shards (tokenised where missing or stale) and the held-out documents."""
    lake, config = pipeline.lake, pipeline.config.mixture
    cuts = _heldout_cuts(pipeline)
    excluded = excluded_ids(lake)
    tokenizer_path = lake.artifact("tokenizer", TOKENIZER_FILE)  # a local copy on each Ray worker
    spec = StageSpec(
        outputs=(TOKENS_STAGE, HELDOUT_STAGE),
        make_work=functools.partial(
            TokenizeWork,
            TOKENS_STAGE,
            HELDOUT_STAGE,
            tokenizer_path,
            config.eos_token,
            cuts,
            excluded,
        ),
        # A retrained tokenizer, or a held-out set that moved, retokenises every shard.
        params=repr(
            (hashlib.sha256(trained.to_str().encode()).hexdigest(), config.eos_token, cuts, sorted(excluded))
        ),
    )
    sources, heldout = {}, [HELDOUT_SCHEMA.empty_table()]
    for name in sorted(pipeline.config.source_names):
        run = ray.run_stage(context, spec, lake, name, upstream_inputs(lake, "scored_documents", name))
        folder = lake.local_slice(TOKENS_STAGE, name)
        sources[name] = SourceTokens(name, [TokenShard.open(folder, key) for key in run.records])
        heldout.append(lake.read_table(HELDOUT_STAGE, name))
    return sources, pa.concat_tables(heldout)


def _kept_batches(pipeline: PipelineResource, source: str, columns: list[str]) -> Iterator[pa.Table]:
    """The kept documents training may use: the neutral set and its copies left out."""
    excluded = excluded_ids(pipeline.lake)
    for batch in pipeline.lake.iter_batches("scored_documents", source, columns=columns):
        yield without_excluded(kept_rows(batch), excluded)


def _heldout_cuts(pipeline: PipelineResource) -> dict[str, int | None]:
    """Per source, the held-out cut on the id hash, from the kept documents' ids alone."""
    mixture = pipeline.config.mixture
    return {
        name: heldout_cut(
            (i for batch in _kept_batches(pipeline, name, ["id", "keep"]) for i in batch["id"].to_pylist()),
            mixture.heldout_fraction,
            mixture.heldout_min_documents,
            mixture.heldout_max_share,
        )
        for name in pipeline.config.source_names
    }


@dg.asset(
    group_name="training",
    kinds={"numpy", "ray"},
    deps=["tokenizer", "scored_documents", "neutral_documents"],
    metadata=operated(1, "mixture", "checks.max_share_error", refresh=REMIX),
    check_specs=[
        dg.AssetCheckSpec(
            "target_shares_met",
            asset="tokenized_mixture",
            description="every source's achieved token share is within checks.max_share_error of its target "
            "(non-blocking: a small source at its epoch cap, or an emptied one, is worth a look, not a stop)",
        ),
        dg.AssetCheckSpec(
            WEIGHTED_SOURCES_TRAINED,
            asset="tokenized_mixture",
            blocking=True,
            description="every source with a non-zero mixture weight got training tokens (blocking: a source "
            "held out whole, or left with nothing to train on, would move its weight silently to the others)",
        ),
    ],
)
def tokenized_mixture(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Packed training sequences drawn by the sources' mixture weights, plus held-out documents."""
    lake = pipeline.lake
    trained = load_tokenizer(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    sources, heldout = _tokenize_sources(context, pipeline, ray, trained)
    vocab_size = trained.get_vocab_size(with_added_tokens=True)
    eos = eos_id(trained, pipeline.config.mixture.eos_token)
    with lake.writing_artifact("tokenized_mixture") as out_dir:
        report = pack_mixture(sources, heldout, vocab_size, eos, pipeline.config.mixture, out_dir)
    for warning in report["warnings"]:
        context.log.warning(f"tokenized_mixture: {warning}")
    shares = report["sources"]
    names = sorted(shares)
    plot = bars_png(
        names,
        {
            "target": [shares[n]["target_share"] for n in names],
            "achieved": [shares[n]["achieved_share"] for n in names],
        },
        "share of training tokens",
        "mixture",
    )
    return dg.MaterializeResult(
        metadata={
            "sequences": report["num_sequences"],
            "tokens": report["total_tokens"],
            "shares": dg.MetadataValue.json(
                {n: {k: shares[n][k] for k in ("target_share", "achieved_share", "epochs")} for n in names}
            ),
            "plot": dg.MetadataValue.md(png_markdown(plot, "target vs achieved token shares")),
            "path": dg.MetadataValue.path(str(out_dir)),
        },
        check_results=[
            problems_result(
                "target_shares_met",
                share_error_violations(shares, pipeline.config.checks),
                {
                    "max_share_error": round(
                        max(abs(s["achieved_share"] - s["target_share"]) for s in shares.values()), 4
                    ),
                    "warnings": dg.MetadataValue.json(report["warnings"]),
                },
            ),
            problems_result(
                WEIGHTED_SOURCES_TRAINED,
                untrained_sources(shares, pipeline.config.mixture.weights),
                {"training_tokens": dg.MetadataValue.json({n: shares[n]["tokens"] for n in names})},
            ),
        ],
    )
