"""Expert-parallel training over gloo against one process: the demo preset's training step (forward,
backward, gradient reduction, optimizer) on the same global batch of 16 x 128 tokens, timed

- baseline "one process": EP=1, batch 16, all CPU cores;
- "ep2": two processes of batch 8 (the `make demo` set-up), 4 of the 8 experts each, tokens sent
  all-to-all over gloo, the cores split between them.

On a 2-core CPU the two processes share the cores the baseline used alone, so `ratio` = ep2 / one
process is what expert parallelism costs on one machine (all-to-all, a host sync per MoE layer, two
smaller batches); on GPUs each process has its own device. `demo_training_seconds` = 300 steps at the
measured step time, the training part of `make demo`.

    .venv/bin/python -m benchmarks.expert_parallel [--steps 20] [--warmup 3]

Last line: one JSON object with keys bench, device, one_process_s_per_step, ep2_s_per_step, ratio,
demo_training_seconds_one_process, demo_training_seconds_ep2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: idle threads must not spin

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from benchmarks._smoke import parse_with_smoke  # noqa: E402
from moe_dag.training.config import ParallelConfig, preset  # noqa: E402
from moe_dag.training.distributed import DistInfo  # noqa: E402
from moe_dag.training.load_balance import ExpertBiasUpdater  # noqa: E402
from moe_dag.training.model import build_model  # noqa: E402
from moe_dag.training.optim import build_optimizer, build_scheduler  # noqa: E402
from moe_dag.training.parallelize import Parallelism  # noqa: E402
from moe_dag.training.precision import build_recipe  # noqa: E402
from moe_dag.training.synthetic import SyntheticBatches  # noqa: E402
from moe_dag.training.trainer import train_step  # noqa: E402

GLOBAL_BATCH, DEMO_STEPS = 16, 300


class RankBatches:
    """This rank's slice of every global batch of the synthetic stream."""

    def __init__(self, vocab_size: int, seq_len: int, rank: int, world: int) -> None:
        self.stream = SyntheticBatches(vocab_size, seq_len, batch_size=GLOBAL_BATCH, seed=0)
        self.rank, self.world = rank, world

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.chunk(self.world)[self.rank] for t in self.stream.next_batch())


def worker(rank: int, world: int, port: int, steps: int, warmup: int, result: str) -> None:
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    device = torch.device("cpu")
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world, device=device)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    config = preset("demo")
    config = dataclasses.replace(
        config,
        parallel=ParallelConfig(ep=world),
        train=dataclasses.replace(config.train, batch_size=GLOBAL_BATCH // world),
    )
    parallel = Parallelism(config.parallel, info)
    torch.manual_seed(0)
    model = build_model(config.model)
    parallel.shard_experts(model)
    recipe = build_recipe(config.precision)
    wrapped = parallel.wrap(model)
    optimizer = build_optimizer(model, config.optim)
    all_reduce = dist.all_reduce if world > 1 else None
    ExpertBiasUpdater(model.moe_layers(), config.optim.expert_bias_update_rate, all_reduce).register(
        optimizer
    )
    scheduler = build_scheduler(optimizer, warmup + steps, config.optim)
    batches = RankBatches(config.model.vocab_size, config.model.seq_len, rank, world)

    def step() -> float:
        return train_step(wrapped, optimizer, scheduler, batches, config, device, recipe, parallel=parallel)[
            0
        ]

    for _ in range(warmup):
        step()
    if world > 1:
        dist.barrier()
    started = time.perf_counter()
    losses = [step() for _ in range(steps)]
    seconds = (time.perf_counter() - started) / steps
    if rank == 0:
        Path(result).write_text(json.dumps({"s_per_step": seconds, "last_loss": losses[-1]}))
    if world > 1:
        dist.destroy_process_group()


def measure(world: int, steps: int, warmup: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "result.json")
        mp.spawn(worker, args=(world, port, steps, warmup, result), nprocs=world, join=True)
        return json.loads(Path(result).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parse_with_smoke(parser, {"steps": 2, "warmup": 1})
    one = measure(1, args.steps, args.warmup)
    print(f"  one process (EP=1, batch 16)      {one['s_per_step'] * 1e3:8.1f} ms per step")
    ep2 = measure(2, args.steps, args.warmup)
    print(f"  two processes (EP=2, batch 8 x 2) {ep2['s_per_step'] * 1e3:8.1f} ms per step")
    print(
        f"  losses after {args.warmup + args.steps} steps: {one['last_loss']:.6f} and {ep2['last_loss']:.6f}"
    )
    print(
        json.dumps(
            {
                "bench": "expert_parallel",
                "device": "cpu",
                "one_process_s_per_step": round(one["s_per_step"], 4),
                "ep2_s_per_step": round(ep2["s_per_step"], 4),
                "ratio": round(ep2["s_per_step"] / one["s_per_step"], 3),
                "demo_training_seconds_one_process": round(DEMO_STEPS * one["s_per_step"], 1),
                "demo_training_seconds_ep2": round(DEMO_STEPS * ep2["s_per_step"], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
