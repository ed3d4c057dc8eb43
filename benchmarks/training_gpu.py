"""Training throughput of the `proxy-1b` preset on one CUDA GPU, per precision recipe, against bf16.

Each recipe trains the preset from one seed on the synthetic token stream (`training/synthetic.py`)
for `--steps` steps with the trainer's own step. Tokens per second and MFU (model FLOPs per token from
`training/params.py` over the datasheet peak of the recipe's number format) are taken over the steps
after the first `--warmup`; the loss gap is the mean of the last 10 losses against bf16's.

Recipes: `bf16` (the baseline), `fp8` (Transformer Engine; skipped with the reason when it is not
installed) and `fp8-emulated` (the FP8 numerics in PyTorch: it checks the loss, not the speed).

    .venv/bin/python -m benchmarks.training_gpu [--preset proxy-1b] [--steps 120] [--batch-size 8]

Without a CUDA device it measures nothing, says why and exits 0 (`--preset tiny --cpu` checks the
script). Last line: one JSON object with keys bench, device, and per recipe tokens_per_s, mfu, loss_gap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from benchmarks._smoke import parse_with_smoke
from moe_dag.training.config import preset
from moe_dag.training.mfu import peak_flops
from moe_dag.training.params import flops_per_token
from moe_dag.training.synthetic import train_on_synthetic

RECIPES = ("bf16", "fp8", "fp8-emulated")


def transformer_engine_missing() -> str | None:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError as error:
        return f"Transformer Engine is not installed ({error})"
    return None


def measure(name: str, recipe: str, steps: int, warmup: int, batch_size: int, device: torch.device) -> dict:
    config = preset(name)
    config = dataclasses.replace(
        config,
        precision=dataclasses.replace(config.precision, recipe=recipe),
        train=dataclasses.replace(config.train, batch_size=batch_size, steps=steps, seed=0),
    )
    seconds: list[float] = []
    losses = train_on_synthetic(config, steps, device, seconds)
    tokens_per_step = batch_size * config.train.grad_accum_steps * config.model.seq_len
    tokens_per_s = tokens_per_step / statistics.mean(seconds[warmup:])
    peak = peak_flops(device, recipe, None)
    result = {
        "tokens_per_s": round(tokens_per_s),
        "mfu": round(tokens_per_s * flops_per_token(config.model) / peak, 4) if peak else None,
        "first_loss": round(losses[0], 4),
        "final_loss": round(statistics.mean(losses[-10:]), 4),
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
        torch.cuda.reset_peak_memory_stats(device)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="proxy-1b")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cpu", action="store_true", help="run on CPU (to check the script)")
    args = parse_with_smoke(parser, {"preset": "tiny", "steps": 4, "warmup": 1, "batch_size": 2})
    if not torch.cuda.is_available() and not args.cpu:
        print("no CUDA device: nothing measured")
        print(json.dumps({"bench": "training_gpu", "device": "cpu", "skipped": "no CUDA device"}))
        return
    device = torch.device("cpu" if args.cpu else "cuda")
    result: dict = {
        "bench": "training_gpu",
        "device": "cpu" if args.cpu else torch.cuda.get_device_name(device),
        "preset": args.preset,
    }
    for recipe in RECIPES:
        missing = transformer_engine_missing() if recipe == "fp8" else None
        if missing or (recipe == "fp8" and args.cpu):
            result[recipe] = {"skipped": missing or "Transformer Engine needs a GPU"}
        else:
            result[recipe] = measure(args.preset, recipe, args.steps, args.warmup, args.batch_size, device)
            if recipe != "bf16":
                gap = result[recipe]["final_loss"] - result["bf16"]["final_loss"]
                result[recipe]["loss_gap"] = round(abs(gap), 4)
        print(f"{recipe:>13}: {result[recipe]}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
