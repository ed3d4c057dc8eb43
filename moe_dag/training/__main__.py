"""Command line: `python -m moe_dag.training --data DIR --out DIR --preset demo [--steps N] [--seed S]
[--set section.field=value ...]`; the same arguments under `torchrun --nproc-per-node N -m moe_dag.training`.
Nested fields too: `--set model.mla.kv_lora_rank=64`, `--set precision.recipe=fp8-emulated`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from moe_dag.training.config import apply_overrides, preset, preset_names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m moe_dag.training", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="tokenized mixture directory")
    parser.add_argument(
        "--out", type=Path, required=True, help="run directory (resumed if it has checkpoints)"
    )
    parser.add_argument(
        "--preset",
        default="demo",
        help=f"model preset: one of {', '.join(preset_names())} (configs/models/), or a YAML file",
    )
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the preset's)")
    parser.add_argument("--seed", type=int, help="seed for initialisation and data order")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set model.top_k=1 --set optim.lr=1e-3 (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Idle OpenMP threads sleep instead of spinning. On a CPU shared with other processes, spinning
    # threads wait on descheduled peers at every op: 2 threads ran the tiny MoE 20x slower than 1
    # thread; with PASSIVE, 2 threads match or beat 1. Must be set before torch is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from moe_dag.training.trainer import train

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(message)s",
        datefmt="%H:%M:%S",
    )
    config = preset(args.preset)
    train_fields = {"steps": args.steps, "seed": args.seed}
    chosen = {key: value for key, value in train_fields.items() if value is not None}
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, **chosen))
    config = apply_overrides(config, args.overrides)
    summary = train(config, args.data, args.out)
    if rank == 0:
        shown = {
            key: summary[key]
            for key in ("final_train_loss", "steps", "tokens_seen", "wall_seconds", "steps_per_second")
        }
        print(json.dumps(shown, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
