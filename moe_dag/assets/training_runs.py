"""Training runs launched from assets: the command line, the run folder, Dagster Pipes, the results.

The asset starts `python -m moe_dag.training` (which starts torchrun's workers itself for several
processes) through Dagster Pipes: the trainer streams its log into the run's event log as it trains and
reports its final figures, held-out evaluation included, as the asset's materialization. The asset
hands the trainer its place in the graph (`graph_context`: Dagster run id, partition, code version, the
data versions of its inputs, the config digest), which the tracking run carries; the materialization
names the run folder and the tracking run (`tracking.json`), so each is found from the other. The trainer
dies with the Dagster process that launched it (lifeline.py) and refuses a run folder another trainer
holds (run_lock.py), so a killed orchestrator never leaves a second writer behind.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

from moe_dag.assets.dagster_internals import DagsterPipesExecutionError, input_data_versions
from moe_dag.assets.reporting import problems_result
from moe_dag.config import TrainingLaunchConfig
from moe_dag.operations.bounds import ChecksConfig, loss_trend, router_violations
from moe_dag.operations.plots import bars_png, png_markdown
from moe_dag.storage.atomic import atomic_write
from moe_dag.training.config import TrainConfig
from moe_dag.training.data import DATA_ORDER
from moe_dag.training.evaluate import EVAL_FILE
from moe_dag.training.lifeline import launcher_env
from moe_dag.training.run_outputs import MetricsLog
from moe_dag.training.tracking import GRAPH_CONTEXT_FILE, TRACKING_FILE

LATEST_FILE = "latest"
LOSS_FALLING = "loss_finite_and_falling"
ROUTER_HEALTHY = "router_healthy"
RUN_CONFIG_FILE = "run_config.json"  # the resolved training config the trainer is handed
RUN_PLOTS = {"loss_curve": "loss.png", "expert_load": "expert_load.png", "source_shares": "source_shares.png"}


def training_command(
    launch: TrainingLaunchConfig,
    data_dir: Path,
    out_dir: Path,
    eval_on: Path | None = None,
    rendezvous_id: str | None = None,
    graph_context: Path | None = None,
) -> list[str]:
    """The command line of the training process (one process, or torchrun's workers started by it, or
    on several nodes the launcher of one agent per node, meeting as `rendezvous_id`). The trainer reads
    the config resolved at load (`write_run_config`), never the preset again."""
    arguments = ["--data", str(data_dir), "--out", str(out_dir), "--config", str(out_dir / RUN_CONFIG_FILE)]
    arguments += ["--nproc-per-node", str(launch.nproc_per_node)]
    if launch.nnodes > 1:
        arguments += ["--nnodes", str(launch.nnodes)]
        for option, value in (
            ("--rdzv-endpoint", launch.rdzv_endpoint),
            ("--rdzv-id", rendezvous_id),
            ("--ray-address", launch.ray_address),
        ):
            arguments += [option, value] if value else []
    if eval_on is not None:
        arguments += ["--eval-on", str(eval_on)]
    if graph_context is not None:
        arguments += ["--graph-context", str(graph_context)]
    return [sys.executable, "-m", "moe_dag.orchestration.pipes_training", *arguments]


def write_run_config(launch: TrainingLaunchConfig, out_dir: Path) -> Path:
    """The resolved training config, as JSON, in the run folder the trainer is about to use."""
    path = out_dir / RUN_CONFIG_FILE
    with atomic_write(str(path)) as handle:
        handle.write((json.dumps(launch.resolved.to_dict(), indent=2) + "\n").encode())
    return path


def graph_context(context: dg.AssetExecutionContext, config_digest: str) -> dict[str, Any]:
    """Which run of the graph is training: what the tracking run is labelled with (tracking.py)."""
    key = context.asset_key
    return {
        "dagster_run_id": context.run.run_id,
        "asset": key.to_user_string(),
        "partition": context.partition_key if context.has_partition_key else None,
        "code_version": context.assets_def.code_versions_by_key[key],
        "input_data_versions": input_data_versions(context.instance, context.assets_def.asset_deps[key]),
        "config_digest": config_digest,
    }


def tracking_metadata(run_dir: Path) -> dict[str, dg.MetadataValue]:
    """The tracking run of `run_dir` (tracking.json; nothing when tracking was off), for the asset."""
    path = run_dir / TRACKING_FILE
    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    shown = {"tracking": dg.MetadataValue.json(record)}
    return shown | ({"tracking_url": dg.MetadataValue.url(record["url"])} if record.get("url") else {})


def run_dir_for(data_dir: Path, launch: TrainingLaunchConfig, root: Path) -> Path:
    """One folder per (mixture, resolved training config, processes, data order): a rerun resumes there;
    new inputs, any changed training setting (in the preset's file too) or a trainer that reads the
    mixture in another order start afresh, so the trainer never resumes a run under other settings.
    Where the run is tracked (`TrainConfig.TRACKING_FIELDS`) is not a setting of what it trains."""
    mixture = (data_dir / "mixture.json").read_bytes()
    config = launch.resolved.to_dict()
    config["train"] = {k: v for k, v in config["train"].items() if k not in TrainConfig.TRACKING_FIELDS}
    run = {"config": config, "nproc_per_node": launch.nproc_per_node}
    if launch.nnodes > 1:  # (only then, so one node's run folders stay where they were)
        run["nnodes"] = launch.nnodes
    run_json = json.dumps(run, sort_keys=True).encode()
    return root / hashlib.sha256(mixture + run_json + DATA_ORDER.encode()).hexdigest()[:12]


def launch_training(
    context: dg.AssetExecutionContext,
    launch: TrainingLaunchConfig,
    data_dir: Path,
    out_dir: Path,
    eval_on: Path | None = None,
    *,
    config_digest: str,
) -> dict[str, Any]:
    """Train (resuming in `out_dir`) and evaluate on `eval_on`; returns the metadata the run reported,
    with the tracking run's record. `config_digest`: the pipeline config's, for the tracking run."""
    write_run_config(launch, out_dir)
    context_file = out_dir / GRAPH_CONTEXT_FILE
    with atomic_write(str(context_file)) as handle:
        handle.write((json.dumps(graph_context(context, config_digest), indent=2) + "\n").encode())
    command = training_command(
        launch, data_dir, out_dir, eval_on, rendezvous_id=context.run.run_id, graph_context=context_file
    )
    context.log.info("launching: " + shlex.join(command))
    client = dg.PipesSubprocessClient(env=launcher_env())
    try:
        with warnings.catch_warnings():
            # Raised by Dagster's own Pipes client about an API it uses inside: nothing to act on here.
            warnings.simplefilter("ignore", dg.PreviewWarning)
            invocation = client.run(context=context, command=command)
    except DagsterPipesExecutionError as error:
        raise dg.Failure(
            f"the training process failed ({error}); its last log lines above say why "
            f"(exit code 2: {out_dir} is in use by another trainer)"
        ) from error
    (out_dir.parent / LATEST_FILE).write_text(out_dir.name)
    return dict(invocation.get_materialize_result().metadata) | tracking_metadata(out_dir)


def training_check_specs(asset: str) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(
            LOSS_FALLING,
            asset=asset,
            blocking=True,
            description="every logged loss is finite, and the mean of the last checks.loss_window_fraction "
            "of steps lies checks.min_loss_drop_fraction below the mean of the first (blocking: evaluating "
            "a run that diverged or never learned is wasted work, and its comparisons would mislead)",
        ),
        dg.AssetCheckSpec(
            ROUTER_HEALTHY,
            asset=asset,
            description="at the last step no MoE layer has a dead expert and max expert load over mean is "
            "under checks.max_expert_load_over_mean (non-blocking: an unbalanced router makes a worse "
            "model, but its held-out evaluation is still right, and worth reading)",
        ),
    ]


def training_check_results(run_dir: Path, checks: ChecksConfig) -> list[dg.AssetCheckResult]:
    """The `training_check_specs` results of a run, from its metrics.jsonl."""
    records = MetricsLog(run_dir / "metrics.jsonl").read()
    problems, figures = loss_trend([float(r["loss"]) for r in records], checks)
    router = records[-1].get("router") if records else None
    router_figures = (
        {}
        if router is None
        else {
            "max_over_mean": dg.MetadataValue.json(router["max_over_mean"]),
            "dead_experts": dg.MetadataValue.json(router["dead_experts"]),
        }
    )
    return [
        problems_result(LOSS_FALLING, problems, {k: round(v, 4) for k, v in figures.items()}),
        problems_result(ROUTER_HEALTHY, router_violations(router, checks), router_figures),
    ]


def latest_run(root: Path) -> Path:
    """The run folder the newest materialisation trained in."""
    pointer = Path(root) / LATEST_FILE
    if not pointer.exists():
        raise dg.Failure(f"{pointer} not found: materialise the training asset first")
    return Path(root) / pointer.read_text().strip()


def run_plots(run_dir: Path) -> dict[str, dg.MetadataValue]:
    return {
        key: dg.MetadataValue.md(png_markdown(run_dir / name, key.replace("_", " ")))
        for key, name in RUN_PLOTS.items()
        if (run_dir / name).exists()
    }


def read_evaluation(run_dir: Path) -> dict[str, Any]:
    path = run_dir / EVAL_FILE
    if not path.exists():
        raise dg.Failure(f"{path} not found: the run was not evaluated; rematerialise its training asset")
    return json.loads(path.read_text())


def evaluation_rows(report: dict[str, Any], with_overall: bool = False) -> list[dict[str, Any]]:
    """One flat row per source (then one for "all" sources when asked), intervals as low/high columns."""
    named = sorted(report["sources"].items()) + ([("all", report["overall"])] if with_overall else [])
    rows = []
    for source, figures in named:
        row: dict[str, Any] = {"source": source}
        for key, value in figures.items():
            if key.endswith("_ci"):
                row[f"{key}_low"], row[f"{key}_high"] = value or (None, None)
            else:
                row[key] = value
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]], columns: dict[str, str]) -> str:
    """A markdown table of `rows` with `columns` (row key -> header); floats to 4 decimals."""

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns.values()) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(key, "")) for key in columns) + " |" for row in rows]
    return "\n".join(lines)


def bits_per_byte_plot(series: dict[str, list[dict[str, Any]]], title: str) -> dg.MetadataValue:
    """Bars of bits per byte per source for each named list of evaluation rows, with 95% intervals."""
    first = next(iter(series.values()))
    labels = [row["source"] for row in first]
    values = {name: [row["bits_per_byte"] for row in rows] for name, rows in series.items()}
    errors = {
        name: [(row["bits_per_byte_ci_low"], row["bits_per_byte_ci_high"]) for row in rows]
        for name, rows in series.items()
    }
    png = bars_png(labels, values, "held-out bits per byte", title, intervals=errors)
    return dg.MetadataValue.md(png_markdown(png, title))


def training_losses(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(steps, training loss) of a run, from its metrics.jsonl."""
    records = MetricsLog(run_dir / "metrics.jsonl").read()
    return np.array([r["step"] for r in records]), np.array([r["loss"] for r in records])
