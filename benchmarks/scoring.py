"""Quality scoring with early exit against the judge on every document, measured side by side in one run.

The set-up is the default demo's (configs/demo.yaml: backbone, heads, calibration, keep rates, sample
sizes), on the demo corpus's clean documents of each source (what reaches scoring once the rule stages
have removed the injected noise), built in memory from the text on this machine:

1. oracle_sample's split: per source, `oracle.per_source` documents to label and a calibration sample
   sized from the configured precision; the rule-based oracle labels the first.
2. quality_heads: train both heads on the labels, calibrate tau_drop and tau_keep per source on the
   documents the heads never saw, and measure keep-decision F1 against the oracle on held-out labels.
3. scored_documents, twice over every document: baseline `judge_everywhere` (tau_drop = -inf: all
   judge_layer layers and the judge head for every document) and `early_exit` (the calibrated
   tau_drop). The two sides alternate `--repeats` times so background load hits both alike.

Figures: documents per second of each side (median wall time), compute saved (1 - early exit's CPU
time / the baseline's, medians), the share of keep decisions that early exit changed, and judge and
probe F1 at the sources' keep rates. The goal from the design: at least 15% saved at no more than 1%
of decisions changed, judge F1 >= 0.82 (the FineWeb-Edu classifier's), probe F1 below it.

    .venv/bin/python benchmarks/scoring.py [--documents 600] [--repeats 2]

Prints human-readable lines, then as the last line one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.config import PipelineConfig, load_config
from moe_dag.data.demo_corpus.gettext_text import intl_documents
from moe_dag.data.demo_corpus.python_text import code_documents, prose_documents
from moe_dag.data.heads import calibration_sample_size, heldout_keep_f1, load_backbone, train_heads
from moe_dag.data.oracle import RuleBasedOracle, requests_from_table, rubric_for_kind, split_sample
from moe_dag.data.scoring import calibrate_sources, early_exit_summary, score_documents

DOCUMENTS = {"code": code_documents, "prose": prose_documents, "intl": intl_documents}


def demo_documents(config: PipelineConfig, per_source: int) -> pa.Table:
    """`per_source` clean documents of each demo source, as the demo corpus draws them."""
    rows = []
    for source in config.source_names:
        stream = DOCUMENTS[source](random.Random(f"{config.demo_corpus.seed}/{source}"))
        for _, doc in zip(range(per_source), stream, strict=False):
            rows.append({"id": doc.id, "text": doc.text, "source": source})
    return pa.Table.from_pylist(rows)


def timed(fn: Callable[[], pa.Table], wall: list[float], cpu: list[float]) -> pa.Table:
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    result = fn()
    wall.append(time.perf_counter() - started_wall)
    cpu.append(time.process_time() - started_cpu)
    return result


def main(config_path: str, per_source: int, repeats: int) -> dict[str, object]:
    config = load_config(config_path)
    documents = demo_documents(config, per_source)
    keep_rates = {s.name: s.keep_rate for s in config.sources}
    rubrics = {name: rubric_for_kind(kind).name for name, kind in config.source_kinds.items()}

    labelled, calibration = [], []
    for source in config.sources:
        mine = documents.filter(pc.equal(documents["source"], source.name))
        needed = calibration_sample_size(source.keep_rate, config.calibration)
        to_label, to_calibrate = split_sample(mine, config.oracle.per_source, needed, config.oracle.seed)
        labelled.append(to_label)
        calibration.append(to_calibrate)
    sample = pa.concat_tables(labelled)
    labels = [
        result.label for result in RuleBasedOracle().label(requests_from_table(sample, config.source_kinds))
    ]
    print(f"{documents.num_rows} documents, {sample.num_rows} of them labelled by the rules oracle")

    backbone = load_backbone(config.backbone)
    started = time.perf_counter()
    trained = train_heads(
        backbone,
        sample["text"].to_pylist(),
        [label.rubric for label in labels],
        [label.scores for label in labels],
        sample["source"].to_pylist(),
        config.heads,
    )
    unseen = pa.concat_tables([sample.take(trained.heldout.index), *calibration])
    thresholds = calibrate_sources(
        unseen, backbone, trained.heads, rubrics, keep_rates, config.calibration, config.backbone.batch_size
    )
    f1 = heldout_keep_f1(trained.heldout, keep_rates)
    print(f"heads trained and calibrated in {time.perf_counter() - started:.0f}s")
    for source, t in thresholds.items():
        judge_f1, probe_f1 = (f1.get(f"{head}_f1_{source}", math.nan) for head in ("judge", "probe"))
        print(
            f"  {source}: tau_keep {t.tau_keep:.3f}, tau_drop {t.tau_drop:.3f} on {t.n_calibration} unseen "
            f"documents ({t.early_exit_rate:.1%} exit), keep F1 judge {judge_f1:.3f}, probe {probe_f1:.3f}"
        )

    by_source = {s: documents.filter(pc.equal(documents["source"], s)) for s in config.source_names}
    sides = {
        "judge_everywhere": {s: replace(t, tau_drop=-math.inf) for s, t in thresholds.items()},
        "early_exit": thresholds,
    }
    batch = config.backbone.batch_size
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    scored: dict[str, pa.Table] = {}
    for _ in range(repeats):
        for side, chosen in sides.items():
            scored[side] = timed(
                lambda chosen=chosen: pa.concat_tables(  # code and text rows carry different dimensions
                    [
                        score_documents(by_source[s], backbone, trained.heads, chosen[s], batch)
                        for s in by_source
                    ],
                    promote_options="permissive",
                ),
                wall[side],
                cpu[side],
            )

    changed = np.mean(
        np.asarray(scored["early_exit"]["keep"].to_pylist())
        != np.asarray(scored["judge_everywhere"]["keep"].to_pylist())
    )
    exits = early_exit_summary(scored["early_exit"], backbone.config)
    rate = {side: documents.num_rows / statistics.median(times) for side, times in wall.items()}
    saved = 1.0 - statistics.median(cpu["early_exit"]) / statistics.median(cpu["judge_everywhere"])
    for side in sides:
        runs = ", ".join(f"{t:.1f}" for t in wall[side])
        median_cpu = statistics.median(cpu[side])
        print(f"{side:>16}: {rate[side]:6.1f} docs/s (runs of {runs} s wall; CPU {median_cpu:.1f} s)")
    print(
        f"early exit: {exits['early_exit_rate']:.1%} of documents leave at the probe; compute saved "
        f"{saved:.1%} in CPU time ({exits['layer_compute_saved']:.1%} of backbone layers); keep decisions "
        f"changed {changed:.2%}; kept {exits['kept_rate']:.1%}"
    )
    print(
        f"keep-decision F1 vs the oracle on {trained.heldout.index.size} held-out labels: judge "
        f"{f1['judge_f1']:.3f}, probe {f1['probe_f1']:.3f}"
    )
    return {
        "bench": "scoring",
        "baseline": "judge_everywhere",
        "documents": documents.num_rows,
        "early_exit_docs_per_s": round(rate["early_exit"], 2),
        "judge_everywhere_docs_per_s": round(rate["judge_everywhere"], 2),
        "early_exit_rate": round(exits["early_exit_rate"], 4),
        "compute_saved": round(saved, 4),
        "layer_compute_saved": round(exits["layer_compute_saved"], 4),
        "decisions_changed": round(float(changed), 4),
        "judge_f1": round(f1["judge_f1"], 4),
        "probe_f1": round(f1["probe_f1"], 4),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--documents", type=int, default=600, help="documents per source")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(main(args.config, args.documents, args.repeats)))
