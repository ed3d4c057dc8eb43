"""The comparisons that say what the proxy's number means: the curation's gain and the MoE's gain.

- `unfiltered_mixture`: the curated mixture's recipe (weights, sequence length, token budget,
  tokenizer) applied to every ingested document, minus the curated held-out documents, the neutral
  evaluation set and their copies.
- `curation_gain`: the same proxy trained on it for the same steps, scored beside the curated proxy.
- `moe_gain`: a dense model with the proxy's active parameters trained on the curated mixture, scored
  beside the MoE proxy.

Each comparison trains one more run (through Pipes, on the training device, like `moe_proxy`), scores
both runs at their last two checkpoints on the curated held-out documents and on every evaluation set
(the neutral set, drawn before any filter, does not favour the curated mixture by construction as the
curated held-out set does), and reports per set and source the two models' bits per byte and the gain
with a paired 95% interval, as tables and a plot, plus both training curves. Each set's result ends in
one sentence (`verdict`): the gain and its interval, or "not resolved at this budget" with the steps
the gain's measured trend and interval say would resolve it.
"""

import json
from pathlib import Path

import dagster as dg

from moe_dag.assets.evaluation import evaluation_set_dirs
from moe_dag.assets.mixture import REMIX
from moe_dag.assets.operating import operated
from moe_dag.assets.resources import PipelineResource, RayResource
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
from moe_dag.mixture.neutral import NEUTRAL_SET
from moe_dag.mixture.unfiltered import build_unfiltered_mixture
from moe_dag.operations.plots import curves_png, png_markdown
from moe_dag.settings.training import ComparisonSettings, comparison_settings, unfiltered_mixture_settings
from moe_dag.storage.lake import Lake
from moe_dag.training.baselines import dense_overrides
from moe_dag.training.compare import compare_runs, read_document_losses, verdict
from moe_dag.training.eval_sets import evaluate_on_sets, set_folder
from moe_dag.training.evaluate import resolve_device

CURATED_SET = "curated"  # the curated mixture's own held-out documents

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
    kinds={"numpy", "ray"},
    deps=["raw_documents", "dedup_clusters", "tokenizer", "tokenized_mixture", "neutral_documents"],
    metadata=operated(2, unfiltered_mixture_settings, refresh=REMIX),
)
def unfiltered_mixture(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Every ingested document (no filters, dedup or quality heads) packed like the curated mixture, to
    the same token budget; the curated held-out documents, the neutral set, and their exact and near
    copies left out. Raw text is read and tokenised per shard on Ray (moe_dag/mixture/unfiltered.py)."""
    lake, settings = pipeline.lake, unfiltered_mixture_settings(pipeline.config)
    built = build_unfiltered_mixture(
        lake,
        settings.sources,
        settings.mixture,
        lambda spec, source, inputs: ray.run_stage(context, spec, lake, source, inputs),
    )
    return dg.MaterializeResult(
        metadata={
            "sequences": built.report["num_sequences"],
            "tokens": built.report["total_tokens"],
            "documents": built.documents,
            "removed_as_heldout_copies": dg.MetadataValue.json(built.removed),
            "warnings": dg.MetadataValue.json(built.report["warnings"]),
            "path": dg.MetadataValue.path(str(built.out_dir)),
        }
    )


@dg.asset(
    group_name="comparisons",
    kinds={"pytorch"},
    deps=["unfiltered_mixture", "proxy_eval", "evaluation_sets"],
    pool="gpu",
    metadata=operated(2, comparison_settings),
)
def curation_gain(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The proxy trained on the unfiltered mixture for the same steps, against the curated proxy on the
    curated held-out documents: gain = unfiltered bits per byte - curated bits per byte."""
    lake, settings = pipeline.lake, comparison_settings(pipeline.config)
    launch = settings.training
    data_dir = lake.artifact_dir("unfiltered_mixture")
    with lake.writing_artifact("curation_gain") as runs:
        run_dir = run_dir_for(data_dir, launch, runs)
        curated = lake.artifact_dir("tokenized_mixture")
        launch_training(context, launch, data_dir, run_dir, curated, config_digest=pipeline.config_digest)
        proxy_run = latest_run(lake.artifact_dir("moe_proxy"))
        return _comparison(lake, settings, proxy_run, run_dir, "curated", "unfiltered", "curation gain")


@dg.asset(
    group_name="comparisons",
    kinds={"pytorch"},
    deps=["tokenized_mixture", "proxy_eval", "evaluation_sets"],
    pool="gpu",
    metadata=operated(2, comparison_settings),
)
def moe_gain(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """A dense model with the proxy's active parameters, trained like it on the curated mixture, against
    the MoE proxy on the held-out documents: gain = dense bits per byte - MoE bits per byte."""
    lake, settings = pipeline.lake, comparison_settings(pipeline.config)
    launch = settings.training
    dense = launch.with_overrides(dense_overrides(launch.resolved.model))
    data_dir = lake.artifact_dir("tokenized_mixture")
    with lake.writing_artifact("moe_gain") as runs:
        run_dir = run_dir_for(data_dir, dense, runs)
        launch_training(context, dense, data_dir, run_dir, data_dir, config_digest=pipeline.config_digest)
        proxy_run = latest_run(lake.artifact_dir("moe_proxy"))
        return _comparison(lake, settings, proxy_run, run_dir, "MoE", "dense", "MoE gain")


def _comparison(
    lake: Lake,
    settings: ComparisonSettings,
    proxy_run: Path,
    baseline_run: Path,
    proxy_name: str,
    baseline_name: str,
    what: str,
) -> dg.MaterializeResult:
    """Both runs scored at their last two checkpoints on the curated held-out documents and on every
    evaluation set; per set the paired gain, and one sentence that says whether it is resolved."""
    curated_set = {CURATED_SET: lake.artifact_dir("tokenized_mixture")}
    sets = curated_set | evaluation_set_dirs(lake, settings.evaluation)
    device = resolve_device("auto")
    scored = [evaluate_on_sets(run, sets, checkpoints=2, device=device) for run in (proxy_run, baseline_run)]
    results: dict[str, dict] = {}
    for name in sets:
        steps = sorted(set(scored[0][name]) & set(scored[1][name]))
        by_step = [
            compare_runs(
                read_document_losses(set_folder(proxy_run, name, step)),
                read_document_losses(set_folder(baseline_run, name, step)),
            )
            for step in steps
        ]
        final = by_step[-1]
        judged = verdict(
            steps,
            [g["overall"]["gain"] for g in by_step],
            final["overall"]["gain_ci"],
            f"{what} on the {name} set",
        )
        results[name] = {**final, **judged, "steps": steps}
    (baseline_run / "comparison.json").write_text(json.dumps(results, indent=2) + "\n")
    curves = {
        name: training_losses(run) for name, run in ((proxy_name, proxy_run), (baseline_name, baseline_run))
    }
    losses = curves_png(curves, "step", "training loss (nats / token)", f"{proxy_name} vs {baseline_name}")
    series = {
        name: evaluation_rows(read_evaluation(run))
        for name, run in ((proxy_name, proxy_run), (baseline_name, baseline_run))
    }
    curated = results[CURATED_SET]["overall"]
    headline = results[NEUTRAL_SET if NEUTRAL_SET in results else CURATED_SET]
    tables = "\n\n".join(
        f"**{name}** ({result['sentence']})\n\n"
        + markdown_table(evaluation_rows(result, with_overall=True), GAIN_COLUMNS)
        for name, result in results.items()
    )
    return dg.MaterializeResult(
        metadata={
            "verdict": headline["sentence"],
            "verdicts": dg.MetadataValue.json({name: result["sentence"] for name, result in results.items()}),
            "gains": dg.MetadataValue.json(
                {
                    name: {
                        "gain": result["overall"]["gain"],
                        "gain_ci95": result["overall"]["gain_ci"],
                        "resolved": result["resolved"],
                        "steps_to_resolve": result["steps_to_resolve"],
                    }
                    for name, result in results.items()
                }
            ),
            "gain_bits_per_byte": curated["gain"],
            "gain_ci95": dg.MetadataValue.json(curated["gain_ci"]),
            f"{proxy_name}_bits_per_byte": curated["proxy_bits_per_byte"],
            f"{baseline_name}_bits_per_byte": curated["baseline_bits_per_byte"],
            "documents": curated["documents"],
            "table": dg.MetadataValue.md(tables),
            "plot": bits_per_byte_plot(series, f"held-out bits per byte: {proxy_name} vs {baseline_name}"),
            "training_loss": dg.MetadataValue.md(png_markdown(losses, "training loss")),
            "baseline_run": dg.MetadataValue.path(str(baseline_run)),
        }
    )
