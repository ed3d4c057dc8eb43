"""tokenizer and tokenized_mixture: a BPE tokenizer on the kept training documents, then packed token
sequences and the held-out documents."""

import dagster as dg

from moe_dag.assets.plots import bars_png, png_markdown
from moe_dag.data.mixture import build_mixture, training_documents
from moe_dag.data.schema import kept_rows
from moe_dag.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from moe_dag.resources import PipelineResource

TOKENIZER_FILE = "tokenizer.json"


def _kept_scored(pipeline: PipelineResource) -> dict:
    return {
        name: kept_rows(pipeline.lake.read_table("scored_documents", name))
        for name in pipeline.config.source_names
    }


@dg.asset(group_name="training", kinds={"huggingface"}, deps=["scored_documents"])
def tokenizer(pipeline: PipelineResource) -> dg.MaterializeResult:
    """A byte-level BPE tokenizer trained on the kept documents of training: the documents the mixture
    holds out for evaluation (the same split, computed from the same config) never reach it."""
    mixture = pipeline.config.mixture
    documents = training_documents(
        _kept_scored(pipeline), mixture.heldout_fraction, mixture.heldout_min_documents
    )
    texts = (text for table in documents.values() for text in table["text"].to_pylist())
    trained = train_tokenizer(texts, pipeline.config.tokenizer)
    path = pipeline.lake.artifact_dir("tokenizer") / TOKENIZER_FILE
    save_tokenizer(trained, path)
    return dg.MaterializeResult(
        metadata={
            "vocab_size": trained.get_vocab_size(),
            "training_documents": sum(table.num_rows for table in documents.values()),
            "path": dg.MetadataValue.path(str(path)),
        }
    )


@dg.asset(
    group_name="training",
    kinds={"numpy"},
    deps=["tokenizer", "scored_documents"],
    check_specs=[dg.AssetCheckSpec("target_shares_met", asset="tokenized_mixture")],
)
def tokenized_mixture(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Packed training sequences drawn by the sources' mixture weights, plus held-out documents."""
    lake = pipeline.lake
    trained = load_tokenizer(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    out_dir = lake.artifact_dir("tokenized_mixture")
    report = build_mixture(_kept_scored(pipeline), trained, pipeline.config.mixture, out_dir)
    sources = report["sources"]
    names = sorted(sources)
    plot = bars_png(
        names,
        {
            "target": [sources[n]["target_share"] for n in names],
            "achieved": [sources[n]["achieved_share"] for n in names],
        },
        "share of training tokens",
        "mixture",
    )
    return dg.MaterializeResult(
        metadata={
            "sequences": report["num_sequences"],
            "tokens": report["total_tokens"],
            "shares": dg.MetadataValue.json(
                {n: {k: sources[n][k] for k in ("target_share", "achieved_share", "epochs")} for n in names}
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
