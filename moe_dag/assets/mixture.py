"""tokenizer and tokenized_mixture: a BPE tokenizer on the kept training documents, then packed token
sequences and the held-out documents. The work is moe_dag/mixture/curated.py; these assets wire it
to Dagster (resources, metadata, checks).
"""

import dagster as dg

from moe_dag.assets.operating import operated
from moe_dag.assets.reporting import problems_result
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.mixture.curated import TOKENS_STAGE as TOKENS_STAGE  # the mixture search reads them
from moe_dag.mixture.curated import build_curated_mixture, train_curated_tokenizer
from moe_dag.mixture.tokenizer import TOKENIZER_FILE as TOKENIZER_FILE  # the tokenizer's file in its folder
from moe_dag.mixture.tokenizer import eos_id
from moe_dag.operations.bounds import epoch_cap_shortfalls, share_error_violations, untrained_sources
from moe_dag.operations.plots import bars_png, png_markdown
from moe_dag.operations.refresh import Refresh
from moe_dag.settings.training import mixture_settings, tokenizer_settings
from moe_dag.storage.catalog import MIXTURE_SEQUENCE_STAGES

WEIGHTED_SOURCES_TRAINED = "weighted_sources_trained"
WITHIN_EPOCH_CAP = "sources_within_epoch_cap"
# The mixture follows new scored documents when some source's kept documents moved past a share.
REMIX = Refresh(population="scored_documents", threshold="remix_after_change")
SEQUENCES_STAGE = MIXTURE_SEQUENCE_STAGES[0]  # the curated mixture's sequence map


@dg.asset(
    group_name="training",
    kinds={"huggingface"},
    deps=["scored_documents", "neutral_documents"],
    # the held-out cut comes from the mixture config
    metadata=operated(2, tokenizer_settings, refresh=REMIX),
)
def tokenizer(pipeline: PipelineResource, ray: RayResource) -> dg.MaterializeResult:
    """A byte-level BPE tokenizer trained on the kept documents of training, streamed from the lake (past
    `tokenizer.max_training_documents`, on a sample of them by id hash): the documents held out for
    evaluation (the mixture's cut, and the neutral set with its copies) never reach it. The passes over
    the scored files run as Ray tasks (`ray` connects this run to the cluster). With `tokenizer.from`, that
    pretrained tokenizer instead (it must hold the mixture's end-of-document token)."""
    del ray  # required for its connection: the library's tasks run wherever this process is connected
    settings = tokenizer_settings(pipeline.config)
    trained = train_curated_tokenizer(pipeline.lake, settings.sources, settings.mixture, settings.tokenizer)
    try:
        eos_id(trained.tokenizer, settings.mixture.eos_token)
    except ValueError as error:
        raise dg.Failure(f"{error}: set mixture.eos_token to one of its special tokens") from None
    pretrained = settings.tokenizer.from_
    return dg.MaterializeResult(
        metadata={
            **(
                {"pretrained": pretrained, "pretrained_digest": settings.pretrained_digest}
                if pretrained
                else {}
            ),
            "vocab_size": trained.tokenizer.get_vocab_size(),
            "training_documents": trained.documents,
            # more than training_documents when the corpus outgrew tokenizer.max_training_documents
            "training_documents_available": trained.available,
            "path": dg.MetadataValue.path(str(trained.path)),
        }
    )


@dg.asset(
    group_name="training",
    kinds={"numpy", "ray"},
    deps=["tokenizer", "scored_documents", "neutral_documents"],
    metadata=operated(1, mixture_settings, refresh=REMIX),
    pool="duckdb_catalog",  # it registers its sequence map in the catalog, which takes one writer at a time
    check_specs=[
        dg.AssetCheckSpec(
            "target_shares_met",
            asset="tokenized_mixture",
            description="every source's achieved token share is within checks.max_share_error of its target "
            "(a warning: a small source at its epoch cap, or an emptied one, is worth a look, not a stop)",
        ),
        dg.AssetCheckSpec(
            WITHIN_EPOCH_CAP,
            asset="tokenized_mixture",
            description="no source reached its mixture.max_epochs cap while the others went on (a warning: "
            "such a source trains at less than its share)",
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
    """Packed training sequences drawn by the sources' mixture weights, plus held-out documents; the
    catalog view `tokenized_mixture_sequences` maps each sequence to its documents' token spans."""
    lake, settings = pipeline.lake, mixture_settings(pipeline.config)
    report, out_dir = build_curated_mixture(
        lake,
        settings.sources,
        settings.mixture,
        lambda spec, source, inputs: ray.run_stage(context, spec, lake, source, inputs),
    )
    pipeline.catalog.refresh({SEQUENCES_STAGE: False})
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
                share_error_violations(shares, settings.checks),
                {
                    "max_share_error": round(
                        max(abs(s["achieved_share"] - s["target_share"]) for s in shares.values()), 4
                    ),
                    "warnings": dg.MetadataValue.json(report["warnings"]),
                },
            ),
            problems_result(
                WITHIN_EPOCH_CAP,
                epoch_cap_shortfalls(shares, settings.mixture.max_epochs),
                {"epochs": dg.MetadataValue.json({n: round(shares[n]["epochs"], 4) for n in names})},
            ),
            problems_result(
                WEIGHTED_SOURCES_TRAINED,
                untrained_sources(shares, settings.mixture.weights),
                {"training_tokens": dg.MetadataValue.json({n: shares[n]["tokens"] for n in names})},
            ),
        ],
    )
