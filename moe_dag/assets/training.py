"""moe_proxy and proxy_eval: train the MoE proxy in its own process, then score held-out text."""

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow as pa

from moe_dag.assets.plots import png_markdown
from moe_dag.config import TrainingLaunchConfig
from moe_dag.resources import PipelineResource
from moe_dag.training.evaluate import evaluate_checkpoint


def training_command(launch: TrainingLaunchConfig, data_dir: Path, out_dir: Path) -> list[str]:
    """The command line of the training process: plain python for one process, torchrun for more."""
    if launch.nproc_per_node > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={launch.nproc_per_node}",
        ]
    else:
        launcher = [sys.executable]
    arguments = ["--data", str(data_dir), "--out", str(out_dir), "--preset", launch.preset]
    arguments += ["--steps", str(launch.steps), "--seed", str(launch.seed)]
    for key, value in sorted(launch.overrides.items()):
        arguments += ["--set", f"{key}={value}"]
    return [*launcher, "-m", "moe_dag.training", *arguments]


def run_dir_for(data_dir: Path, launch: TrainingLaunchConfig, root: Path) -> Path:
    """One folder per (mixture, training config): a rerun resumes there, new inputs start afresh."""
    mixture = (data_dir / "mixture.json").read_bytes()
    launch_json = json.dumps(dataclasses.asdict(launch), sort_keys=True, default=str).encode()
    return root / hashlib.sha256(mixture + launch_json).hexdigest()[:12]


@dg.asset(group_name="training", kinds={"pytorch"}, deps=["tokenized_mixture"], pool="gpu")
def moe_proxy(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The MoE proxy model, trained by `python -m moe_dag.training` (torchrun for several processes)."""
    lake = pipeline.lake
    data_dir = lake.artifact_dir("tokenized_mixture")
    launch = pipeline.config.training
    out_dir = run_dir_for(data_dir, launch, lake.artifact_dir("moe_proxy"))
    command = training_command(launch, data_dir, out_dir)
    context.log.info("launching: " + " ".join(command))
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            context.log.info(line.rstrip())
    if process.returncode != 0:
        raise dg.Failure(f"training process exited with code {process.returncode}: {' '.join(command)}")
    (lake.artifact_dir("moe_proxy") / "latest").write_text(out_dir.name)
    summary = json.loads((out_dir / "summary.json").read_text())
    metadata = {
        "run_dir": dg.MetadataValue.path(str(out_dir)),
        "final_train_loss": summary["final_train_loss"],
        "steps": summary["steps"],
        "tokens_seen": summary["tokens_seen"],
        "wall_seconds": summary["wall_seconds"],
        "total_params": summary["params"]["total"],
        "active_params": summary["params"]["active"],
    }
    if (out_dir / "loss.png").exists():
        metadata["loss_curve"] = dg.MetadataValue.md(png_markdown(out_dir / "loss.png", "training loss"))
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(group_name="training", kinds={"pytorch", "parquet"}, deps=["moe_proxy"], pool="duckdb_catalog")
def proxy_eval(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Held-out loss and bits per byte of the proxy, per source."""
    lake = pipeline.lake
    root = lake.artifact_dir("moe_proxy")
    run_dir = root / (root / "latest").read_text().strip()
    checkpoint = Path(json.loads((run_dir / "summary.json").read_text())["checkpoint"])
    report = evaluate_checkpoint(checkpoint, lake.artifact_dir("tokenized_mixture"))
    rows = [{"source": name, **figures} for name, figures in sorted(report["sources"].items())]
    lake.write_table(pa.Table.from_pylist(rows), "proxy_eval")
    pipeline.catalog.refresh({"proxy_eval": False})
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    return dg.MaterializeResult(
        metadata={
            "loss": report["overall"]["loss"],
            "bits_per_byte": report["overall"]["bits_per_byte"],
            "checkpoint": dg.MetadataValue.path(str(checkpoint)),
            "per_source": dg.MetadataValue.json(report["sources"]),
        }
    )
