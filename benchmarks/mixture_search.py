"""Mixture search on the demo corpus: a swarm of small proxies, a regression from mixture weights to
neutral-set bits per byte, the proposal validated by one more proxy, against the configured mixture.

Baseline: `configured`, a proxy of the same size and steps trained on configs/demo.yaml's weights.

The corpus is built in memory-light steps without the curation stages (the search is about weights,
not filters): the demo corpus's raw documents, the neutral set drawn by id hash and removed with its
exact copies, a tokenizer trained on the rest, one token shard per source; then every candidate packs
those shards to its weights (nothing tokenised again) and trains `python -m moe_dag.training` with
`--eval-on` the neutral set, `--parallel` at a time. Prints per candidate its shares and achieved bits
per byte, the models' leave-one-out errors, the proposal; last line JSON: `bench`, `candidates`,
`spearman_loo`, `model`, `loo_rmse`, `predicted`, `predicted_interval`, `achieved`,
`validation_error` (achieved - predicted) with `validation_error_ci` (+- 1.96 leave-one-out RMSE: the
error the fit makes on unseen runs; every run is scored on the same neutral documents, so their own
interval, `achieved_ci`, moves all runs together and is not the prediction's), `inside_predicted_interval`,
`gain_vs_configured` (proposal - configured, negative: the proposal is better) with its paired 95%
interval, `gain_resolved`, `wall_s`. Options: `--candidates`, `--steps`, `--parallel`,
`--docs-per-source`, `--neutral-per-source`, `--concentration`, `--keep` (a folder to keep the runs in).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from moe_dag.config import load_config
from moe_dag.data.demo_corpus import build_demo_corpus
from moe_dag.data.mixture import SourceTokens, write_token_shard
from moe_dag.data.mixture.neutral import select_neutral, without_excluded, write_evaluation_set
from moe_dag.data.mixture.search import (
    AVERAGE,
    MixtureSearchConfig,
    config_snippet,
    fit_regressions,
    pack_candidate,
    propose,
    sample_candidates,
    shares_of,
)
from moe_dag.data.readers import list_shards, read_shards
from moe_dag.data.tokenizer import eos_id, train_tokenizer
from moe_dag.training.compare import average_bits_per_byte
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE, EVAL_FILE

REPO = Path(__file__).resolve().parent.parent


def build_corpus(work: Path, docs_per_source: int, neutral_per_source: int):
    """(token shards per source, tokenizer vocab and eos, neutral set folder, config) on the demo corpus."""
    config = load_config(REPO / "configs" / "demo.yaml")
    corpus = dataclasses.replace(config.demo_corpus, docs_per_source=docs_per_source)
    build_demo_corpus(work / "corpus", corpus)
    raw = {}
    for source in config.source_names:
        documents = read_shards(list_shards(str(work / "corpus" / source)), source).documents
        raw[source] = documents.select(["id", "text"])
    neutral, excluded = select_neutral(
        config.source_names, lambda s: iter([raw[s]]), neutral_per_source, None
    )
    excluded_ids = set(excluded["id"].to_pylist())
    training = {source: without_excluded(table, excluded_ids) for source, table in raw.items()}
    tokenizer = train_tokenizer(
        (t for table in training.values() for t in table["text"].to_pylist()), config.tokenizer
    )
    eos = eos_id(tokenizer, config.mixture.eos_token)
    shards = {
        source: SourceTokens(source, [write_token_shard(table, tokenizer, eos, work / "shards", source)])
        for source, table in training.items()
    }
    neutral_dir = work / "neutral"
    write_evaluation_set(neutral, tokenizer, eos, config.mixture.seq_len, neutral_dir)
    print(
        f"corpus: {sum(t.num_rows for t in training.values())} training documents, "
        f"{neutral.num_rows} neutral, {len(excluded_ids) - neutral.num_rows} exact copies removed"
    )
    return shards, tokenizer.get_vocab_size(with_added_tokens=True), eos, neutral_dir, config


def train_proxy(data_dir: Path, neutral_dir: Path, search: MixtureSearchConfig, threads: int) -> Path:
    out = data_dir / "run"
    command = [sys.executable, "-m", "moe_dag.training", "--data", str(data_dir), "--out", str(out)]
    command += ["--preset", "demo", "--steps", str(search.steps), "--eval-on", str(neutral_dir)]
    settings = {**search.overrides, "train.num_threads": threads, "train.checkpoint_every": search.steps}
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"training {data_dir.name} failed:\n{done.stderr[-3000:]}")
    return out


def per_source_losses(run: Path) -> dict[str, float]:
    report = json.loads((run / EVAL_FILE).read_text())
    return {source: figures["bits_per_byte"] for source, figures in report["sources"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--steps", type=int, default=MixtureSearchConfig.steps)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--docs-per-source", type=int, default=1500)
    parser.add_argument("--neutral-per-source", type=int, default=150)
    parser.add_argument("--concentration", type=float, default=MixtureSearchConfig.concentration)
    parser.add_argument("--keep", type=Path, help="keep the corpus, shards and runs in this folder")
    args = parser.parse_args()
    started = time.perf_counter()
    search = MixtureSearchConfig(
        candidates=args.candidates, steps=args.steps, parallel=args.parallel, concentration=args.concentration
    )
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        shards, vocab, eos, neutral_dir, config = build_corpus(
            work, args.docs_per_source, args.neutral_per_source
        )
        sources = sorted(shards)
        weights = config.mixture.weights
        rows = config.mixture.seq_len + 1
        budget = search.steps * int(search.overrides["train.batch_size"]) * rows
        recipe = dataclasses.replace(config.mixture, total_tokens=budget)
        capacity = {s: int(sum(shard.lengths.sum() for shard in shards[s].shards)) for s in sources}
        shares_CS = sample_candidates(weights, capacity, budget, recipe.max_epochs, search)
        threads = max(1, (os.cpu_count() or 1) // search.parallel)

        def run(name: str, shares: dict[str, float]) -> Path:
            folder = work / "candidates" / name
            pack_candidate(shards, shares, vocab, eos, recipe, folder)
            return train_proxy(folder, neutral_dir, search, threads)

        names = [f"c{i:03d}" for i in range(len(shares_CS))]
        jobs = {n: dict(zip(sources, row, strict=True)) for n, row in zip(names, shares_CS, strict=True)}
        jobs["configured"] = shares_of(weights)
        with ThreadPoolExecutor(search.parallel) as pool:
            runs = dict(zip(jobs, pool.map(run, jobs, jobs.values()), strict=True))
        swarm_s = time.perf_counter() - started
        losses = {s: np.array([per_source_losses(runs[n])[s] for n in names]) for s in sources}
        losses[AVERAGE] = np.mean([losses[s] for s in sources], axis=0)
        fit = fit_regressions(sources, shares_CS, losses)
        for name, row, loss, loo in zip(names, shares_CS, losses[AVERAGE], fit.loo_predictions, strict=True):
            shown = " ".join(f"{s}={share:.3f}" for s, share in zip(sources, row, strict=True))
            print(f"{name}: {shown}  bits/byte {loss:.4f}  leave-one-out predicted {loo:.4f}")
        print("leave-one-out RMSE: " + ", ".join(f"{m} {e:.4f}" for m, e in fit.loo_rmse.items()))
        proposal = propose(fit, weights, capacity, budget, recipe.max_epochs, search)
        print(config_snippet(proposal))
        runs["proposal"] = run("proposal", proposal.shares)
        tables = [pq.read_table(runs[n] / EVAL_DOCUMENTS_FILE) for n in ("configured", "proposal")]
        points, own, paired = average_bits_per_byte(tables)
    achieved, achieved_ci = points[1], own[1]
    gain, gain_ci = points[1] - points[0], paired[1]
    low, high = proposal.predicted_interval
    print(
        f"proposal: predicted {proposal.predicted:.4f} ({low:.4f}-{high:.4f}), achieved {achieved:.4f}; "
        f"configured {points[0]:.4f}; gain {gain:+.4f} ({gain_ci[0]:+.4f} to {gain_ci[1]:+.4f})"
    )
    result = {
        "bench": "mixture_search",
        "candidates": len(names),
        "steps": search.steps,
        "spearman_loo": round(fit.spearman_loo, 3),
        "model": fit.model_name,
        "loo_rmse": {m: round(e, 4) for m, e in fit.loo_rmse.items()},
        "proposal": {s: round(v, 3) for s, v in proposal.shares.items()},
        "predicted": round(proposal.predicted, 4),
        "predicted_interval": [round(low, 4), round(high, 4)],
        "achieved": round(achieved, 4),
        "validation_error": round(achieved - proposal.predicted, 4),
        "validation_error_ci": [round(achieved - high, 4), round(achieved - low, 4)],
        "achieved_ci": [round(v, 4) for v in achieved_ci],
        "inside_predicted_interval": low <= achieved <= high,
        "configured": round(points[0], 4),
        "gain_vs_configured": round(gain, 4),
        "gain_vs_configured_ci": [round(v, 4) for v in gain_ci],
        "gain_resolved": not gain_ci[0] <= 0 <= gain_ci[1],
        "swarm_s": round(swarm_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
