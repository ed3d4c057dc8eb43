"""The comparisons that say what the proxy's number means: the curation's gain and the MoE's gain.

- `unfiltered_mixture`: the curated mixture's recipe (weights, sequence length, token budget,
  tokenizer) applied to every ingested document, minus copies of the curated held-out documents.
- `curation_gain`: the same proxy trained on it for the same steps, scored on the curated held-out
  documents beside the curated proxy.
- `moe_gain`: a dense model with the proxy's active parameters trained on the curated mixture, scored
  beside the MoE proxy.

Each comparison trains one more run (through Pipes, on the training device, like `moe_proxy`) and
reports per source the two models' bits per byte with 95% intervals and the gain with a paired 95%
interval, as a table and a plot, plus both training curves.
"""

import dataclasses
import json
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from moe_dag.assets.mixture import TOKENIZER_FILE
from moe_dag.assets.operating import operated
from moe_dag.assets.plots import curves_png, png_markdown
from moe_dag.assets.training_runs import (
    bits_per_byte_plot,
    evaluation_rows,
    latest_run,
    launch_training,
    markdown_table,
    read_evaluation,
    run_dir_for,
    training_losses,
)
from moe_dag.data.mixture import build_mixture
from moe_dag.data.mixture.unfiltered import unfiltered_documents
from moe_dag.data.tokenizer import load_tokenizer
from moe_dag.orchestration.resources import PipelineResource
from moe_dag.training.baselines import dense_overrides
from moe_dag.training.compare import compare_runs, read_document_losses

GAIN_COLUMNS = {
    "source": "source",
    "documents": "documents",
    "proxy_bits_per_byte": "proxy bits/byte",
    "baseline_bits_per_byte": "baseline bits/byte",
    "gain": "gain",
    "gain_ci_low": "gain 95% low",
    "gain_ci_high": "gain 95% high",
}


@dg.asset(
    group_name="comparisons",
    kinds={"numpy"},
    deps=["raw_documents", "dedup_clusters", "tokenizer", "tokenized_mixture"],
    metadata=operated(1, "mixture"),
)
def unfiltered_mixture(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Every ingested document (no filters, dedup or quality heads) packed like the curated mixture, to
    the same token budget; the curated held-out documents and their exact and near copies left out."""
    lake, config = pipeline.lake, pipeline.config
    curated_dir = lake.artifact_dir("tokenized_mixture")
    curated = json.loads((curated_dir / "mixture.json").read_text())
    heldout_ids = set(pq.read_table(curated_dir / "heldout.parquet", columns=["id"])["id"].to_pylist())
    raw = {
        name: lake.read_table("raw_documents", name, columns=["id", "text"]) for name in config.source_names
    }
    clusters = lake.read_table("dedup_clusters", columns=["id", "cluster_id"])
    documents, removed = unfiltered_documents(raw, heldout_ids, clusters)
    # Scored on the curated held-out set only: this mixture keeps nothing back of its own.
    recipe = dataclasses.replace(
        config.mixture, total_tokens=curated["total_tokens"], heldout_fraction=0.0, heldout_min_documents=0
    )
    tokenizer = load_tokenizer(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    out_dir = lake.artifact_dir("unfiltered_mixture")
    report = build_mixture(documents, tokenizer, recipe, out_dir)
    return dg.MaterializeResult(
        metadata={
            "sequences": report["num_sequences"],
            "tokens": report["total_tokens"],
            "documents": sum(table.num_rows for table in documents.values()),
            "removed_as_heldout_copies": dg.MetadataValue.json(removed),
            "warnings": dg.MetadataValue.json(report["warnings"]),
            "path": dg.MetadataValue.path(str(out_dir)),
        }
    )


@dg.asset(
    group_name="comparisons",
    kinds={"pytorch"},
    deps=["unfiltered_mixture", "proxy_eval"],
    pool="gpu",
    metadata=operated(1, "training"),
)
def curation_gain(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The proxy trained on the unfiltered mixture for the same steps, against the curated proxy on the
    curated held-out documents: gain = unfiltered bits per byte - curated bits per byte."""
    lake, launch = pipeline.lake, pipeline.config.training
    data_dir = lake.artifact_dir("unfiltered_mixture")
    run_dir = run_dir_for(data_dir, launch, lake.artifact_dir("curation_gain"))
    launch_training(context, launch, data_dir, run_dir, eval_on=lake.artifact_dir("tokenized_mixture"))
    return _comparison(latest_run(lake.artifact_dir("moe_proxy")), run_dir, "curated", "unfiltered")


@dg.asset(
    group_name="comparisons",
    kinds={"pytorch"},
    deps=["tokenized_mixture", "proxy_eval"],
    pool="gpu",
    metadata=operated(1, "training"),
)
def moe_gain(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """A dense model with the proxy's active parameters, trained like it on the curated mixture, against
    the MoE proxy on the held-out documents: gain = dense bits per byte - MoE bits per byte."""
    lake, launch = pipeline.lake, pipeline.config.training
    dense = launch.with_overrides(dense_overrides(launch.resolved.model))
    data_dir = lake.artifact_dir("tokenized_mixture")
    run_dir = run_dir_for(data_dir, dense, lake.artifact_dir("moe_gain"))
    launch_training(context, dense, data_dir, run_dir, eval_on=data_dir)
    return _comparison(latest_run(lake.artifact_dir("moe_proxy")), run_dir, "MoE", "dense")


def _comparison(
    proxy_run: Path, baseline_run: Path, proxy_name: str, baseline_name: str
) -> dg.MaterializeResult:
    gains = compare_runs(read_document_losses(proxy_run), read_document_losses(baseline_run))
    rows = evaluation_rows(gains, with_overall=True)
    (baseline_run / "comparison.json").write_text(json.dumps(gains, indent=2) + "\n")
    curves = {
        name: training_losses(run) for name, run in ((proxy_name, proxy_run), (baseline_name, baseline_run))
    }
    losses = curves_png(curves, "step", "training loss (nats / token)", f"{proxy_name} vs {baseline_name}")
    series = {
        name: evaluation_rows(read_evaluation(run))
        for name, run in ((proxy_name, proxy_run), (baseline_name, baseline_run))
    }
    overall = gains["overall"]
    return dg.MaterializeResult(
        metadata={
            "gain_bits_per_byte": overall["gain"],
            "gain_ci95": dg.MetadataValue.json(overall["gain_ci"]),
            f"{proxy_name}_bits_per_byte": overall["proxy_bits_per_byte"],
            f"{baseline_name}_bits_per_byte": overall["baseline_bits_per_byte"],
            "documents": overall["documents"],
            "table": dg.MetadataValue.md(markdown_table(rows, GAIN_COLUMNS)),
            "plot": bits_per_byte_plot(series, f"held-out bits per byte: {proxy_name} vs {baseline_name}"),
            "training_loss": dg.MetadataValue.md(png_markdown(losses, "training loss")),
            "baseline_run": dg.MetadataValue.path(str(baseline_run)),
        }
    )
