"""Command line: `python -m moe_dag.training --data DIR --out DIR --preset demo [--steps N] [--seed S]
[--set section.field=value ...] [--nproc-per-node N] [--eval-on DIR] [--nnodes N [--rdzv-endpoint HOST:PORT]
[--rdzv-id ID] [--ray-address ADDRESS]]`. `--preset` names a file of
configs/models/ or a YAML path; `--set` reaches nested fields too (`--set model.mla.kv_lora_rank=64`,
`--set precision.recipe=fp8-emulated`). `--config FILE` takes a resolved config instead of a preset:
the `moe_proxy` asset resolves its preset once, in the Dagster process, and hands the trainer that file.

`--nproc-per-node N` (N > 1) starts N data-parallel workers through torchrun's launcher in this
process; `torchrun --nproc-per-node N -m moe_dag.training ...` does the same by hand. `--eval-on DIR`
scores the final checkpoint on DIR's held-out documents right after training, on the device the run
trained on, and writes `eval.json` and `eval_documents.parquet` into the run folder. `--nnodes N`
(N > 1) starts one torchrun agent per node instead, meeting through c10d rendezvous (multinode.py).

`python -m moe_dag.orchestration.pipes_training` is the same command reporting to Dagster (what the
`moe_proxy` asset launches): rank 0 streams its log to Dagster and reports the final figures as the asset's
materialization. A launcher that sets $MOE_DAG_LAUNCHER_PID takes the
trainer down with it (see lifeline.py). Exit status 2: the run folder is in use by another trainer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from moe_dag.training.config import Config, apply_overrides, override_settings, preset, preset_names
from moe_dag.training.lifeline import die_with_launcher, launcher_env
from moe_dag.training.multinode import (
    NODE_OPTIONS,
    Rendezvous,
    free_local_endpoint,
    run_local_agents,
    run_ray_agents,
    without_options,
)
from moe_dag.training.reporting import OpenReporter, Reporter, no_reporter
from moe_dag.training.run_lock import RunFolderInUse
from moe_dag.training.strict_config import ConfigError, read_yaml
from moe_dag.training.tracking import read_graph_context

log = logging.getLogger("moe_dag.training")
NPROC_OPTION = "--nproc-per-node"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m moe_dag.training", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="tokenized mixture directory")
    parser.add_argument(
        "--out", type=Path, required=True, help="run directory (resumed if it has checkpoints)"
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--preset",
        default="demo",
        help=f"model preset: one of {', '.join(preset_names())} (configs/models/), or a YAML file",
    )
    chosen.add_argument(
        "--config",
        type=Path,
        help="a resolved training config (JSON of every section, as the moe_proxy asset writes it), "
        "instead of a preset",
    )
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    parser.add_argument("--seed", type=int, help="seed for initialisation")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set model.top_k=1 --set optim.lr=1e-3 (repeatable); "
        "VALUE is YAML (null, [kda, mla]; kda,mla is a list too)",
    )
    parser.add_argument(
        NPROC_OPTION, dest="nproc_per_node", type=int, default=1, help="data-parallel worker processes"
    )
    parser.add_argument(
        "--eval-on", type=Path, help="tokenized mixture directory whose held-out documents score the run"
    )
    parser.add_argument(
        "--graph-context",
        type=Path,
        help="a JSON file saying which run of the launcher's graph this is (Dagster run id, asset, code "
        "and data versions, config digest), logged to the tracking run (tracking.py)",
    )
    nodes = parser.add_argument_group("several nodes (multinode.py)")
    nodes.add_argument("--nnodes", type=int, default=1, help="nodes, each running --nproc-per-node workers")
    nodes.add_argument(
        "--rdzv-endpoint",
        help="host:port of the c10d rendezvous (default: node 0's address and a free port there)",
    )
    nodes.add_argument("--rdzv-id", help="the rendezvous id, new for each run (default: a random one)")
    nodes.add_argument(
        "--ray-address",
        help="start each node's agent as a task on its own node of this Ray cluster (default: every "
        "agent on this machine)",
    )
    # Set by the launcher on each agent.
    nodes.add_argument("--node-rank", type=int, help=argparse.SUPPRESS)
    nodes.add_argument("--rdzv-host-node", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nnodes < 1:
        parser.error(f"--nnodes must be at least 1, got {args.nnodes}")
    return args


def main(
    argv: list[str] | None = None,
    open_reporter: OpenReporter = no_reporter,
    module: str = "moe_dag.training",
) -> int:
    """Train (and evaluate) as the command line says. `open_reporter` gives rank 0 somewhere to send
    the final figures; `module` is what torchrun's workers run, so they report the same way."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        config = resolve_config(args)
    except (ConfigError, OSError) as error:
        raise SystemExit(f"python -m moe_dag.training: {error}") from None
    # Idle OpenMP threads sleep instead of spinning. On a CPU shared with other processes, spinning
    # threads wait on descheduled peers at every op: 2 threads ran the tiny MoE 20x slower than 1
    # thread; with PASSIVE, 2 threads match or beat 1. Must be set before torch is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    die_with_launcher()
    if args.nnodes > 1 and args.node_rank is None:
        with open_reporter(True) as reporter:
            _configure_logging(0, reporter)
            return _launch_nodes(args, argv, module, reporter)
    if (args.nproc_per_node > 1 or args.nnodes > 1) and "LOCAL_RANK" not in os.environ:
        return _launch_workers(args.nproc_per_node, argv, module, _rendezvous(args))
    rank = int(os.environ.get("RANK", "0"))
    with open_reporter(rank == 0) as reporter:
        _configure_logging(rank, reporter)
        try:
            return _train_and_evaluate(config, args, reporter, is_main=rank == 0)
        except RunFolderInUse as error:
            log.error("%s", error)
            return 2


def _launch_workers(
    nproc_per_node: int, argv: list[str], module: str, node: tuple[Rendezvous, int] | None = None
) -> int:
    """torchrun's launcher, in this process: it inherits the lifeline and passes it on to the workers.
    One node: a standalone rendezvous; one of several: `node`'s c10d rendezvous, as that node's agent."""
    from torch.distributed import run as torchrun

    os.environ.update(launcher_env())  # every worker dies with this process, however it ends
    worker_argv = without_options(argv, (NPROC_OPTION, *NODE_OPTIONS))
    if node is None:
        # A standalone rendezvous picks a free port, so several single-node runs can share a machine.
        options = ["--standalone", f"--nproc-per-node={nproc_per_node}"]
    else:
        options = node[0].torchrun_options(nproc_per_node, node[1])
    torchrun.main([*options, "-m", module, *worker_argv])
    return 0


def _rendezvous(args: argparse.Namespace) -> tuple[Rendezvous, int] | None:
    """An agent's rendezvous and node rank (None on one node)."""
    if args.nnodes == 1:
        return None
    rendezvous = Rendezvous(
        nnodes=args.nnodes, endpoint=args.rdzv_endpoint, run_id=args.rdzv_id, host_node=args.rdzv_host_node
    )
    return rendezvous, args.node_rank


def _launch_nodes(args: argparse.Namespace, argv: list[str], module: str, reporter: Reporter) -> int:
    """Start every node's agent (multinode.py), wait for them, then report what rank 0 wrote in the
    run folder: the workers report nothing themselves, as they may run on other machines."""
    run_id = args.rdzv_id or uuid.uuid4().hex
    args.out.mkdir(parents=True, exist_ok=True)
    if args.ray_address:
        gpus = args.nproc_per_node if _trains_on_cuda(args) else 0
        code = run_ray_agents(
            args.rdzv_endpoint,
            run_id,
            argv,
            module,
            nnodes=args.nnodes,
            ray_address=args.ray_address,
            out_dir=args.out,
            gpus_per_node=gpus,
        )
    else:
        rendezvous = Rendezvous(
            nnodes=args.nnodes,
            endpoint=args.rdzv_endpoint or free_local_endpoint(),
            run_id=run_id,
            host_node=0 if args.rdzv_endpoint is None else None,  # node 0 hosts on the port chosen here
        )
        code = run_local_agents(rendezvous, argv, module)
    if code != 0:
        log.error("a node's agent exited with status %d", code)
        return code
    from moe_dag.training.evaluate import EVAL_FILE

    summary = json.loads((args.out / "summary.json").read_text())
    evaluation = json.loads((args.out / EVAL_FILE).read_text()) if args.eval_on else None
    _report(summary, args.out, evaluation, reporter)
    return 0


def _trains_on_cuda(args: argparse.Namespace) -> bool:
    device = resolve_config(args).train.device
    return device == "cuda" or (device == "auto" and _cuda_available())


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _configure_logging(rank: int, reporter: Reporter) -> None:
    # Under Dagster the progress reaches the event log through Pipes; stderr keeps only warnings.
    level = logging.INFO if rank == 0 and not reporter.active else logging.WARNING
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, handlers=[handler])


def resolve_config(args: argparse.Namespace) -> Config:
    """The config the command line asks for: the resolved config file or the preset, then --steps,
    --seed and each --set."""
    if args.config is not None:
        config = Config.from_dict(read_yaml(args.config), origin=str(args.config))  # JSON is YAML
    else:
        config = preset(args.preset)
    chosen = {
        f"train.{name}": getattr(args, name) for name in ("steps", "seed") if getattr(args, name) is not None
    }
    config = override_settings(config, chosen, origin="--steps/--seed")
    return apply_overrides(config, args.overrides)


def _train_and_evaluate(config: Config, args: argparse.Namespace, reporter: Reporter, is_main: bool) -> int:
    from moe_dag.training.evaluate import evaluate_run
    from moe_dag.training.trainer import train

    summary = train(config, args.data, args.out, graph=read_graph_context(args.graph_context))
    if not is_main:
        return 0
    evaluation = evaluate_run(args.out, args.eval_on, device=summary["device"]) if args.eval_on else None
    _report(summary, args.out, evaluation, reporter)
    return 0


def _report(summary: dict[str, Any], out_dir: Path, evaluation: dict | None, reporter: Reporter) -> None:
    shown = {
        key: summary[key]
        for key in ("final_train_loss", "steps", "tokens_seen", "wall_seconds", "steps_per_second")
    }
    print(json.dumps(shown, indent=2))
    reporter.report_materialization(_result_metadata(summary, out_dir, evaluation))


def _result_metadata(summary: dict[str, Any], out_dir: Path, evaluation: dict | None) -> dict[str, Any]:
    metadata = {
        "run_dir": {"raw_value": str(out_dir.resolve()), "type": "path"},
        "final_train_loss": summary["final_train_loss"],
        "steps": summary["steps"],
        "tokens_seen": summary["tokens_seen"],
        "wall_seconds": summary["wall_seconds"],
        "device": summary["device"],
        "world_size": summary["world_size"],
        "total_params": summary["params"]["total"],
        "active_params": summary["params"]["active"],
    }
    if evaluation is not None:
        overall = evaluation["overall"]
        metadata |= {
            "heldout_bits_per_byte": overall["bits_per_byte"],
            "heldout_bits_per_byte_ci95": overall["bits_per_byte_ci"],
            "heldout_documents": overall["documents"],
        }
    return metadata


if __name__ == "__main__":
    sys.exit(main())
