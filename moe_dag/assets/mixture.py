"""tokenizer and tokenized_mixture: a BPE tokenizer on the kept documents, then packed token sequences.

Tokenisation fans out like the per-source stages: one token shard per scored shard, in parallel on Ray,
each with a completion record, so a rerun tokenises only new or changed shards. Sampling and packing
then run here, over memory-mapped token shards.
"""

import functools
import hashlib
from pathlib import Path

import dagster as dg
import pyarrow as pa
from tokenizers import Tokenizer

from moe_dag.assets.plots import bars_png, png_markdown
from moe_dag.data.engine import StageSpec, upstream_inputs
from moe_dag.data.engine.stages import TokenizeWork
from moe_dag.data.mixture import SourceTokens, TokenShard, pack_mixture
from moe_dag.data.mixture.build import HELDOUT_SCHEMA
from moe_dag.data.schema import kept_rows
from moe_dag.data.tokenizer import eos_id, load_tokenizer, save_tokenizer, train_tokenizer
from moe_dag.resources import PipelineResource, RayResource

TOKENIZER_FILE = "tokenizer.json"
TOKENS_STAGE = "tokenized_mixture/shards"
HELDOUT_STAGE = "tokenized_mixture/heldout"


@dg.asset(group_name="training", kinds={"huggingface"}, deps=["scored_documents"])
def tokenizer(pipeline: PipelineResource) -> dg.MaterializeResult:
    """A byte-level BPE tokenizer trained on every kept document, streamed from the lake."""
    lake = pipeline.lake
    texts = (
        text
        for name in pipeline.config.source_names
        for batch in lake.iter_batches("scored_documents", name, columns=["text", "keep"])
        for text in kept_rows(batch)["text"].to_pylist()
    )
    trained = train_tokenizer(texts, pipeline.config.tokenizer)
    path = lake.artifact_dir("tokenizer") / TOKENIZER_FILE
    save_tokenizer(trained, path)
    return dg.MaterializeResult(
        metadata={"vocab_size": trained.get_vocab_size(), "path": dg.MetadataValue.path(str(path))}
    )


def _tokenize_sources(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource, trained: Tokenizer
) -> tuple[dict[str, SourceTokens], pa.Table]:
    """Every source's token shards (tokenised where missing or stale) and the held-out documents."""
    lake, config = pipeline.lake, pipeline.config.mixture
    tokenizer_path = str(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    spec = StageSpec(
        outputs=(TOKENS_STAGE, HELDOUT_STAGE),
        make_work=functools.partial(
            TokenizeWork,
            TOKENS_STAGE,
            HELDOUT_STAGE,
            tokenizer_path,
            config.eos_token,
            config.heldout_fraction,
        ),
        # A retrained tokenizer retokenises every shard.
        params=repr(
            (hashlib.sha256(trained.to_str().encode()).hexdigest(), config.eos_token, config.heldout_fraction)
        ),
    )
    sources, heldout = {}, [HELDOUT_SCHEMA.empty_table()]
    for name in sorted(pipeline.config.source_names):
        run = ray.run_stage(context, spec, lake, name, upstream_inputs(lake, "scored_documents", name))
        folder = Path(lake.dataset_dir(TOKENS_STAGE, name))
        sources[name] = SourceTokens(name, [TokenShard.open(folder, key) for key in run.records])
        heldout.append(lake.read_table(HELDOUT_STAGE, name))
    return sources, pa.concat_tables(heldout)


@dg.asset(
    group_name="training",
    kinds={"numpy", "ray"},
    deps=["tokenizer", "scored_documents"],
    check_specs=[dg.AssetCheckSpec("target_shares_met", asset="tokenized_mixture")],
)
def tokenized_mixture(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Packed training sequences drawn by the sources' mixture weights, plus held-out documents."""
    lake = pipeline.lake
    trained = load_tokenizer(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    sources, heldout = _tokenize_sources(context, pipeline, ray, trained)
    out_dir = lake.artifact_dir("tokenized_mixture")
    vocab_size = trained.get_vocab_size(with_added_tokens=True)
    eos = eos_id(trained, pipeline.config.mixture.eos_token)
    report = pack_mixture(sources, heldout, vocab_size, eos, pipeline.config.mixture, out_dir)
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
        # Not blocking: a small source hitting its epoch cap is worth a look, not a stop.
        check_results=[
            dg.AssetCheckResult(
                check_name="target_shares_met",
                passed=not report["warnings"],
                metadata={"warnings": dg.MetadataValue.json(report["warnings"])},
            )
        ],
    )
