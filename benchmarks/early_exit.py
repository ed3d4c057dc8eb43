"""Early-exit scoring against the baseline "full forward", measured side by side in one run.

Both sides call `moe_dag.data.scoring.score_documents` on the same documents with the same backbone and
heads; only tau_drop differs. Full forward: tau_drop = -inf, so every document runs all judge_layer
backbone layers and the judge head. Early exit: tau_drop is the `exit_share` quantile of the probe scores
(taken from the baseline's own output), so that share of documents stops at the probe layer.

The heads are freshly initialised, not trained: timing depends on how many documents exit, not on how
good the decisions are. The documents are real English text: docstrings of the Python standard library,
read with `ast` (nothing is imported).

    .venv/bin/python benchmarks/early_exit.py [--documents 300] [--exit-share 0.5] [--repeats 3]

Prints human-readable lines, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from moe_dag.data.heads import (
    Backbone,
    BackboneConfig,
    JudgeHead,
    JudgeHeadConfig,
    ProbeHead,
    QualityHeads,
    Thresholds,
    load_backbone,
)
from moe_dag.data.scoring import early_exit_summary, score_documents

MIN_WORDS = 30  # shorter docstrings are one-line summaries, not documents


@dataclass(kw_only=True)
class EarlyExitBenchConfig:
    documents: int = 300
    exit_share: float = 0.5  # share of documents the probe threshold sends out early
    repeats: int = 3  # timed runs per side; the median is reported
    batch_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.exit_share < 1.0:
            raise ValueError(f"exit_share must be in (0, 1), got {self.exit_share}")
        if self.documents < 1 or self.repeats < 1:
            raise ValueError(f"documents and repeats must be >= 1, got {self.documents}, {self.repeats}")


def stdlib_docstrings(count: int) -> list[str]:
    """The first `count` docstrings of at least MIN_WORDS words, walking the stdlib in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):  # test fixtures with deliberately broken sources
            continue
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node)
            if doc and len(doc.split()) >= MIN_WORDS:
                texts.append(doc)
                if len(texts) == count:
                    return texts
    raise ValueError(f"found only {len(texts)} stdlib docstrings of >= {MIN_WORDS} words under {root}")


def fresh_heads(backbone: Backbone, seed: int) -> QualityHeads:
    torch.manual_seed(seed)
    judge = JudgeHead(backbone.hidden_size, JudgeHeadConfig())
    return QualityHeads(probe=ProbeHead(backbone.hidden_size), judge=judge)


@dataclass
class Timing:
    wall_s: list[float] = field(default_factory=list)
    # CPU seconds of this process: less swayed than wall time by other processes on a shared machine.
    cpu_s: list[float] = field(default_factory=list)

    def run(self, fn: Callable[[], pa.Table]) -> pa.Table:
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        self.wall_s.append(time.perf_counter() - wall)
        self.cpu_s.append(time.process_time() - cpu)
        return result


def main(config: EarlyExitBenchConfig) -> dict[str, object]:
    backbone = load_backbone(BackboneConfig(batch_size=config.batch_size))
    heads = fresh_heads(backbone, config.seed)
    texts = stdlib_docstrings(config.documents)
    table = pa.table({"id": [f"doc-{i}" for i in range(len(texts))], "text": texts})
    print(
        f"{len(texts)} stdlib docstrings, backbone layers 0..{backbone.config.judge_layer} "
        f"(probe at {backbone.config.probe_layer}), {torch.get_num_threads()} torch threads"
    )

    def score(thresholds: Thresholds) -> pa.Table:
        return score_documents(table, backbone, heads, thresholds, config.batch_size)

    full = Thresholds(tau_drop=-math.inf, tau_keep=0.5)
    score_documents(table.slice(0, config.batch_size), backbone, heads, full, config.batch_size)  # warm-up
    full_timing, early_timing = Timing(), Timing()
    baseline = full_timing.run(lambda: score(full))
    probe_scores = baseline["probe_score"].to_numpy()
    early = replace(full, tau_drop=float(np.quantile(probe_scores, config.exit_share)))
    scored = early_timing.run(lambda: score(early))
    # The two sides alternate, so load from other processes on the machine hits both alike.
    for _ in range(config.repeats - 1):
        full_timing.run(lambda: score(full))
        early_timing.run(lambda: score(early))

    # Exiting must not change any score a document still gets.
    stayed = scored["judge_score"].is_valid().to_numpy(zero_copy_only=False)
    judge_gap = np.abs(scored["judge_score"].to_numpy()[stayed] - baseline["judge_score"].to_numpy()[stayed])
    probe_gap = np.abs(scored["probe_score"].to_numpy() - probe_scores)
    summary = early_exit_summary(scored, backbone.config)
    exit_rate = summary["early_exit_rate"]
    print(
        f"tau_drop {early.tau_drop:.4f}: {exit_rate:.1%} of documents exit at the probe "
        f"({summary['layer_compute_saved']:.1%} of backbone layer compute saved, heads not counted)"
    )
    print(f"max score difference vs full forward: probe {probe_gap.max():.2e}, judge {judge_gap.max():.2e}")

    full_rate = len(texts) / statistics.median(full_timing.wall_s)
    early_rate = len(texts) / statistics.median(early_timing.wall_s)
    for name, timing, rate in (
        ("full forward", full_timing, full_rate),
        ("early exit", early_timing, early_rate),
    ):
        runs = ", ".join(f"{t:.2f}" for t in timing.wall_s)
        cpu = ", ".join(f"{t:.2f}" for t in timing.cpu_s)
        print(f"{name:>12}: {rate:6.1f} docs/s (median of runs taking {runs} s; CPU {cpu} s)")
    cpu_speedup = statistics.median(full_timing.cpu_s) / statistics.median(early_timing.cpu_s)
    print(f"speedup: {early_rate / full_rate:.2f}x wall clock, {cpu_speedup:.2f}x in CPU time")
    return {
        "benchmark": "early_exit",
        "baseline": "full_forward",
        "documents": len(texts),
        "early_exit_rate": round(exit_rate, 4),
        "full_forward_docs_per_s": round(full_rate, 2),
        "early_exit_docs_per_s": round(early_rate, 2),
        "speedup": round(early_rate / full_rate, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = EarlyExitBenchConfig()
    parser.add_argument("--documents", type=int, default=defaults.documents)
    parser.add_argument("--exit-share", type=float, default=defaults.exit_share)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    args = parser.parse_args()
    config = EarlyExitBenchConfig(documents=args.documents, exit_share=args.exit_share, repeats=args.repeats)
    print(json.dumps(main(config)))
