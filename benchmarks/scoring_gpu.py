"""Scoring throughput and memory of a gpt-oss-20B backbone on one CUDA GPU: early exit against the judge.

Production scores with the frozen gpt-oss-20B: the probe at layer 18, the judge at layer 24 (its last).
The weights cannot be downloaded here, so the model is built from gpt-oss-20B's shape (transformers'
GptOssModel: 24 layers, hidden 2880, 64 query and 8 key/value heads, 32 experts with 4 active,
alternating sliding-window and full attention) with random bf16 weights. Throughput and memory depend
on the shapes, not the values (routing with random weights is not the trained routing, so expert load
balance may differ). Both sides run the same code as `score_documents`, on random token ids of a fixed
length (tokenisation is not timed):

- baseline `judge_everywhere`: embeddings, layers 0..24, probe and judge heads for every document;
- `probe_exit`: embeddings, layers 0..18 and the probe head: the cost of a document that exits.

A source with early-exit share e then runs at batch / (t_probe + (1 - e) (t_full - t_probe)).

    .venv/bin/python -m benchmarks.scoring_gpu [--tokens 1024] [--batches 16 32 64] [--tiny]

Without a CUDA device it measures nothing, says why and exits 0 (`--tiny` runs a small model of the same
family on CPU, to check the script). Prints human-readable lines, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import GptOssConfig, GptOssModel

from benchmarks._smoke import parse_with_smoke
from moe_dag.quality.heads import (
    Backbone,
    BackboneConfig,
    JudgeHead,
    JudgeHeadConfig,
    ProbeHead,
    QualityHeads,
)

GPT_OSS_20B = {
    "num_hidden_layers": 24,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "vocab_size": 201_088,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
}
TINY = GPT_OSS_20B | {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
}
OUTPUTS = {"general": 5, "code": 4}


def build(shape: dict, device: str, dtype: torch.dtype) -> tuple[Backbone, QualityHeads, float]:
    """The backbone with random weights, the design's heads, and the weights' size in GiB."""
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in bf16 directly: 21B float32 parameters would be 84 GB
    try:
        with torch.device(device):
            model = GptOssModel(GptOssConfig(**shape))
    finally:
        torch.set_default_dtype(default_dtype)
    layers = shape["num_hidden_layers"]
    config = BackboneConfig(
        probe_layer=layers * 3 // 4, judge_layer=layers, device=device, dtype=str(dtype)[6:]
    )
    backbone = Backbone(model, tokenizer=None, config=config)
    with torch.device(device):
        heads = QualityHeads(
            ProbeHead(shape["hidden_size"], OUTPUTS),
            JudgeHead(shape["hidden_size"], JudgeHeadConfig(), OUTPUTS),
        ).eval()
    gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    return backbone, heads, gib


def seconds(fn, repeats: int, device: str) -> float:
    """Median wall time of `fn` after two warm-up calls, synchronising the device around each."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def measure(
    backbone: Backbone, heads: QualityHeads, batch: int, tokens: int, repeats: int
) -> dict[str, float]:
    device = backbone.device.type
    probe_layer, judge_layer = backbone.config.probe_layer, backbone.config.judge_layer
    ids = torch.randint(0, backbone.model.config.vocab_size, (batch, tokens), device=backbone.device)
    mask = torch.ones_like(ids)

    def probe_exit() -> torch.Tensor:
        hidden = backbone.run_layers(backbone.embed(ids), mask, 0, probe_layer)
        return heads.probe(hidden.float(), mask, "general")

    def judge_everywhere() -> torch.Tensor:
        hidden = backbone.run_layers(backbone.embed(ids), mask, 0, probe_layer)
        heads.probe(hidden.float(), mask, "general")
        hidden = backbone.run_layers(hidden, mask, probe_layer, judge_layer)
        return heads.judge(hidden.float(), mask, "general")

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    full = seconds(judge_everywhere, repeats, device)
    probe = seconds(probe_exit, repeats, device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return {"batch": batch, "full_s": full, "probe_s": probe, "peak_gib": peak}


def main(tokens: int, batches: list[int], repeats: int, tiny: bool) -> dict[str, object]:
    if not torch.cuda.is_available() and not tiny:
        print("no CUDA device: nothing measured (run with --tiny to check the script on CPU)")
        return {"bench": "scoring_gpu", "device": "cpu", "skipped": "no CUDA device"}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    backbone, heads, weights_gib = build(TINY if tiny else GPT_OSS_20B, device, torch.bfloat16)
    print(
        f"{name}: {'tiny' if tiny else 'gpt-oss-20B'}-shaped backbone, {weights_gib:.1f} GiB of bf16 weights"
    )
    rows = []
    for batch in batches:
        try:
            row = measure(backbone, heads, batch, tokens, repeats)
        except torch.OutOfMemoryError:
            print(f"batch {batch} x {tokens} tokens: out of memory")
            torch.cuda.empty_cache()
            break
        rows.append(row)
        print(
            f"batch {batch} x {tokens} tokens: judge everywhere {batch / row['full_s']:.1f} docs/s, "
            f"probe exit {batch / row['probe_s']:.1f} docs/s, peak memory {row['peak_gib']:.1f} GiB"
        )
    best = max(rows, key=lambda r: r["batch"] / r["full_s"])
    full_rate, probe_rate = best["batch"] / best["full_s"], best["batch"] / best["probe_s"]
    return {
        "bench": "scoring_gpu",
        "baseline": "judge_everywhere",
        "device": name,
        "tokens": tokens,
        "batch": best["batch"],
        "weights_gib": round(weights_gib, 2),
        "peak_gib": round(best["peak_gib"], 2) if device == "cuda" else None,
        "judge_everywhere_docs_per_s": round(full_rate, 1),
        "probe_exit_docs_per_s": round(probe_rate, 1),
        "saved_per_exit": round(1 - best["probe_s"] / best["full_s"], 4),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--tiny", action="store_true", help="a small model of the same family, on CPU if need be"
    )
    args = parse_with_smoke(parser, {"tokens": 128, "batches": [2], "repeats": 1})
    print(json.dumps(main(args.tokens, args.batches, args.repeats, args.tiny)))
