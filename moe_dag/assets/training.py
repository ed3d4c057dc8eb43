"""moe_proxy and proxy_eval: train the MoE proxy in its own process, then publish its held-out scores."""

from pathlib import Path

import dagster as dg
import pyarrow as pa

from moe_dag.assets.evaluation import SET_DOCUMENTS_STAGE, evaluation_set_dirs
from moe_dag.assets.operating import operated
from moe_dag.assets.resources import PipelineResource
from moe_dag.assets.training_runs import (
    bits_per_byte_plot,
    evaluation_rows,
    latest_run,
    launch_training,
    markdown_table,
    read_evaluation,
    run_dir_for,
    run_plots,
    training_check_results,
    training_check_specs,
)
from moe_dag.mixture.neutral import EvaluationConfig
from moe_dag.settings.training import proxy_eval_settings, proxy_settings
from moe_dag.storage.lake import Lake
from moe_dag.training.eval_sets import evaluate_on_sets
from moe_dag.training.evaluate import resolve_device

SETS_TABLE = "proxy_eval_sets"  # the proxy on the neutral and user evaluation sets

EVAL_COLUMNS = {
    "source": "source",
    "documents": "documents",
    "bits_per_byte": "bits/byte",
    "bits_per_byte_ci_low": "95% low",
    "bits_per_byte_ci_high": "95% high",
    "loss": "nats/token",
}


@dg.asset(
    group_name="training",
    kinds={"pytorch"},
    deps=["tokenized_mixture"],
    metadata=operated(1, proxy_settings),
    pool="gpu",
    check_specs=training_check_specs("moe_proxy"),
)
def moe_proxy(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The MoE proxy, trained by `python -m moe_dag.training` (torchrun's workers for several processes)
    launched through Dagster Pipes, then scored on the held-out documents in the same process, on the
    device it trained on. Loss, expert-load and source-share plots from its metrics."""
    lake = pipeline.lake
    data_dir = lake.artifact_dir("tokenized_mixture")
    settings = proxy_settings(pipeline.config)
    with lake.writing_artifact("moe_proxy") as runs:
        out_dir = run_dir_for(data_dir, settings.training, runs)
        metadata = launch_training(
            context, settings.training, data_dir, out_dir, data_dir, config_digest=pipeline.config_digest
        )
    return dg.MaterializeResult(
        metadata={**metadata, **run_plots(out_dir)},
        check_results=training_check_results(out_dir, settings.checks),
    )


@dg.asset(
    group_name="training",
    kinds={"pytorch", "parquet"},
    deps=["moe_proxy", "evaluation_sets"],
    pool="duckdb_catalog",
    metadata=operated(2, proxy_eval_settings),
)
def proxy_eval(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Held-out loss and bits per byte of the proxy per source, each with its document count and a 95%
    interval over documents: on the curated held-out documents (computed by the training process,
    eval.json) in `proxy_eval`, and on the neutral and user evaluation sets (scored here) in
    `proxy_eval_sets`; both published to the catalog."""
    lake = pipeline.lake
    run_dir = latest_run(lake.artifact_dir("moe_proxy"))
    report = read_evaluation(run_dir)
    lake.write_table(pa.Table.from_pylist(evaluation_rows(report)), "proxy_eval")
    sets = scored_sets(run_dir, lake, proxy_eval_settings(pipeline.config).evaluation)
    set_rows = [
        {"eval_set": name, **row} for name, figures in sets.items() for row in evaluation_rows(figures, True)
    ]
    if set_rows:
        lake.write_table(pa.Table.from_pylist(set_rows), SETS_TABLE)
    pipeline.catalog.refresh({"proxy_eval": False, SETS_TABLE: False, SET_DOCUMENTS_STAGE: False})
    overall = report["overall"]
    return dg.MaterializeResult(
        metadata={
            "evaluation_sets": dg.MetadataValue.json(
                {
                    name: {
                        "bits_per_byte": figures["overall"]["bits_per_byte"],
                        "bits_per_byte_ci95": figures["overall"]["bits_per_byte_ci"],
                        "documents": figures["overall"]["documents"],
                    }
                    for name, figures in sets.items()
                }
            ),
            "per_set": dg.MetadataValue.md(markdown_table(set_rows, {"eval_set": "set", **EVAL_COLUMNS})),
            "bits_per_byte": overall["bits_per_byte"],
            "bits_per_byte_ci95": dg.MetadataValue.json(overall["bits_per_byte_ci"]),
            "loss": overall["loss"],
            "documents": overall["documents"],
            "step": report["step"],
            "checkpoint": dg.MetadataValue.path(report["checkpoint"]),
            "per_source": dg.MetadataValue.md(markdown_table(evaluation_rows(report, True), EVAL_COLUMNS)),
            "plot": bits_per_byte_plot({"proxy": evaluation_rows(report)}, "held-out bits per byte"),
        }
    )


def scored_sets(
    run_dir: Path, lake: Lake, evaluation: EvaluationConfig, checkpoints: int = 1
) -> dict[str, dict]:
    """The run's newest checkpoint scored on every evaluation set (`evaluation_sets` must have run)."""
    sets = evaluation_set_dirs(lake, evaluation)
    missing = [name for name, folder in sets.items() if not (folder / "heldout.parquet").exists()]
    if missing:
        raise dg.Failure(f"evaluation sets {missing} are not tokenised yet: materialise evaluation_sets")
    scored = evaluate_on_sets(run_dir, sets, checkpoints=checkpoints, device=resolve_device("auto"))
    return {name: by_step[max(by_step)] for name, by_step in scored.items()}
