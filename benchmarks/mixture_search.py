"""Mixture search on the demo corpus: a swarm of small proxies, a regression from mixture weights to
neutral-set bits per byte, the proposal validated against the configured mixture.

Baseline: `configured`, proxies of the same preset and steps trained on configs/demo.yaml's weights.

The corpus is built in memory-light steps without the curation stages (the search is about weights, not
filters): the demo corpus's raw documents, the neutral set drawn by id hash and removed with its exact
copies, a tokenizer trained on the rest, one token shard per source. Then every candidate packs those
shards to its weights (an index-level view: nothing is tokenised again, and each source's documents come
in the same seeded order for every candidate, so candidates differ only in their weights) and a proxy of
mixture_search's preset trains on it and is scored on the neutral documents within `--swarm-share` (a
subset of the neutral set, the same documents for every candidate). `--parallel` worker processes train
the proxies, each on its share of the cores, importing torch once rather than once per proxy. The
configured mixture and the proposal are trained `--final-seeds` times (initialisation and document order)
after the swarm, scored on the whole neutral set, and compared paired by seed and by document
(compare.paired_gain: the interval counts the documents' noise and the seeds' shared noise).

Prints per candidate its shares and achieved bits per byte, the models' leave-one-out errors, the
proposal. `--seeds N` runs the whole search N times on one corpus (search seed s: the candidates drawn
with seed s, the swarm trained with seed s); the configured mixture's replicas are trained once and
paired with every search's proposal. Last line JSON: `bench`, `seeds`, `candidates`, `steps`,
`concentration`, `design`, `preset`, `params`, `final_seeds`; every search seed's figure in a list:
`spearman_loo`, `model`, `loo_rmse`, `spread` (standard deviation of the candidates' losses),
`proposals`, `predicted`, `predicted_interval` (+- 1.96 leave-one-out RMSE: the error the fit makes on
unseen runs), `achieved` (mean over the final seeds), `validation_error` (achieved - predicted) with
`validation_error_ci`, `achieved_ci`, `inside_predicted_interval`, `proposal_all`,
`gain_vs_configured` (proposal - configured on the whole neutral set, negative: the proposal is better)
with its 95% interval `gain_vs_configured_ci`, `gain_vs_configured_ci_documents` (the documents' noise
alone), `gain_per_seed` (per replica seed), `gain_seed_share` (of the gain's variance, the seeds' shared
noise), `gain_resolved`, `swarm_s`, `seed_wall_s`; across the seeds: `spearman_loo_median`,
`spearman_loo_min`, `spearman_loo_max`, `spearman_loo_iqr`, `proposal_spread` (the largest difference
of any source's weight between two seeds' proposals); once: `configured` (on the swarm's documents),
`neutral_documents`, `swarm_documents`, `configured_all` (on the whole neutral set), `seed_sd` (one
proxy's training noise, from the final seeds' differences), `profile` (per swarm proxy: training and
scoring seconds, steps per second), `build_s`, `configured_s`, `wall_s`, `wall_s_per_seed`. Options:
`--seeds`, `--candidates`, `--steps`, `--concentration`, `--design`, `--parallel`, `--final-seeds`,
`--docs-per-source`, `--neutral-share`, `--swarm-share`, `--keep` (a folder to keep the runs in; each
search's candidates, losses and proposal in runs/s<seed>/swarm.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow.compute import is_in

from benchmarks._smoke import parse_with_smoke
from moe_dag.config import load_config
from moe_dag.curation.demo_corpus import build_demo_corpus
from moe_dag.mixture import SourceTokens, write_token_shard
from moe_dag.mixture.neutral import is_neutral, select_neutral, without_excluded, write_evaluation_set
from moe_dag.mixture.search import (
    AVERAGE,
    MixtureSearchConfig,
    config_snippet,
    fit_regressions,
    pack_candidate,
    propose,
    replica_name,
    sample_candidates,
    shares_of,
)
from moe_dag.mixture.tokenizer import eos_id, train_tokenizer
from moe_dag.storage.readers import list_shards, read_shards
from moe_dag.training.compare import average_bits_per_byte, gain_of_replicas, mean_document_losses
from moe_dag.training.config import apply_overrides
from moe_dag.training.config import preset as read_preset
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE, EVAL_FILE

REPO = Path(__file__).resolve().parent.parent
CONFIGURED, PROPOSAL = "configured", "proposal"


def build_corpus(work: Path, docs_per_source: int, neutral_share: float, swarm_share: float):
    """(token shards per source, tokenizer vocab and eos, the neutral set's folder and the swarm's part
    of it's folder, the swarm's document ids, config) on the demo corpus."""
    config = load_config(REPO / "configs" / "demo.yaml")
    corpus = dataclasses.replace(config.demo_corpus, docs_per_source=docs_per_source)
    build_demo_corpus(work / "corpus", corpus)
    raw = {}
    for source in config.source_names:
        documents = read_shards(list_shards(str(work / "corpus" / source)), source).documents
        raw[source] = documents.select(["id", "text"])
    neutral, excluded = select_neutral(config.source_names, lambda s: iter([raw[s]]), neutral_share)
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
    # The swarm's documents: those whose id hash is also within `swarm_share` (the lowest hashes, so a
    # subset of the neutral set, drawn as a neutral set of that share would be).
    swarm = neutral.filter(is_neutral(neutral["id"], swarm_share))
    neutral_dir, swarm_dir = work / "neutral", work / "neutral_swarm"
    write_evaluation_set(neutral, tokenizer, eos, config.mixture.seq_len, neutral_dir)
    write_evaluation_set(swarm, tokenizer, eos, config.mixture.seq_len, swarm_dir)
    print(
        f"corpus: {sum(t.num_rows for t in training.values())} training documents, "
        f"{neutral.num_rows} neutral ({swarm.num_rows} of them score the swarm), "
        f"{len(excluded_ids) - neutral.num_rows} exact copies removed"
    )
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    return shards, vocab, eos, neutral_dir, swarm_dir, set(swarm["id"].to_pylist()), config


def _worker_setup() -> None:
    logging.basicConfig(level=logging.WARNING)


def train_proxy(data_dir: str, neutral_dir: str, argv: list[str]) -> dict[str, float]:
    """In a worker process: train `python -m moe_dag.training`'s way (`argv` its options) and score the
    run on the neutral set; the seconds each took, and when it started and ended (`time.time()`)."""
    from moe_dag.training.__main__ import parse_args, resolve_config
    from moe_dag.training.evaluate import evaluate_run
    from moe_dag.training.trainer import train

    began = time.time()
    out = Path(data_dir) / "run"
    config = resolve_config(parse_args(["--data", data_dir, "--out", str(out), *argv]))
    started = time.perf_counter()
    summary = train(config, Path(data_dir), out)
    trained = time.perf_counter()
    evaluate_run(out, Path(neutral_dir))
    return {
        "train_s": trained - started,
        "eval_s": time.perf_counter() - trained,
        "steps_per_s": summary["steps_per_second"],
        "params": summary["params"]["total"],
        "began": began,
        "ended": time.time(),
    }


def per_source_losses(run: Path) -> dict[str, float]:
    report = json.loads((run / EVAL_FILE).read_text())
    return {source: figures["bits_per_byte"] for source, figures in report["sources"].items()}


def proposal_spread(proposals: list[dict[str, float]]) -> float:
    """The largest absolute difference of any source's weight between any two proposals."""
    return max(
        (max(p[s] for p in proposals) - min(p[s] for p in proposals) for s in proposals[0]), default=0.0
    )


def _round(values, digits: int = 4):
    return [round(float(v), digits) for v in values]


def main() -> None:
    defaults = MixtureSearchConfig()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidates", type=int, default=defaults.candidates)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--concentration", type=float, default=defaults.concentration)
    parser.add_argument("--design", choices=["dirichlet", "latin_hypercube"], default=defaults.design)
    parser.add_argument("--parallel", type=int, default=defaults.parallel)
    # A search is a draw: its candidates (the design's seed) and its proxies' initialisation and document
    # order (the training seed) both move `spearman_loo` and the proposal. `--seeds N` runs the whole
    # search N times, search seed s drawing its candidates with seed s and training its swarm with seed
    # s, on one corpus, and reports every value, the median and the worst.
    parser.add_argument("--seeds", type=int, default=1)
    # The gain's interval: in the first default run (2 seeds, 430 neutral documents) the documents'
    # own differences gave 39% of its variance, each seed's noise on each document 61%, and no noise
    # shared by all documents was measurable; both parts shrink with more documents. Scoring a
    # document costs every proxy, so the swarm scores the documents within `swarm_share` and only the
    # deciding proxies score the whole neutral set (docs/mixture_search.md).
    parser.add_argument("--final-seeds", type=int, default=3)
    parser.add_argument("--docs-per-source", type=int, default=2000)
    parser.add_argument("--neutral-share", type=float, default=0.35)
    # The swarm's documents: 0.04 (about half as many as at 0.075) pays for more candidates. The
    # documents drawn move every candidate's target alike (the same documents score all of them), so
    # fewer of them change the function being ranked a little, not each candidate's noise.
    parser.add_argument("--swarm-share", type=float, default=0.04)
    parser.add_argument("--keep", type=Path, help="keep the corpus, shards and runs in this folder")
    args = parse_with_smoke(
        parser, {"candidates": 4, "steps": 5, "final_seeds": 1, "docs_per_source": 150, "seeds": 2}
    )
    started = time.perf_counter()
    search = dataclasses.replace(
        defaults,
        candidates=args.candidates,
        steps=args.steps,
        concentration=args.concentration,
        design=args.design,
        parallel=args.parallel,
        final_seeds=args.final_seeds,
    )
    threads = max(1, (os.cpu_count() or 1) // search.parallel)
    # Read by the workers' OpenMP when they import torch (see moe_dag/training/__main__.py).
    os.environ.update({"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"})
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        shards, vocab, eos, neutral_dir, swarm_dir, swarm_ids, config = build_corpus(
            work, args.docs_per_source, args.neutral_share, args.swarm_share
        )
        build_s = time.perf_counter() - started
        sources = sorted(shards)
        weights = config.mixture.weights
        settings = {**search.overrides, "train.num_threads": threads, "train.checkpoint_every": search.steps}
        preset = search.preset or config.training.preset
        overrides = [f"{key}={value}" for key, value in settings.items()]
        options = ["--preset", preset, "--steps", str(search.steps)]
        options += [item for override in overrides for item in ("--set", override)]
        train = apply_overrides(read_preset(preset), overrides).train
        budget = search.steps * train.batch_size * train.grad_accum_steps * (config.mixture.seq_len + 1)
        recipe = dataclasses.replace(config.mixture, total_tokens=budget)
        capacity = {s: int(sum(shard.lengths.sum() for shard in shards[s].shards)) for s in sources}
        configured = shares_of(weights)
        replica_seeds = range(search.final_seeds)
        runs: dict[str, Path] = {}
        profiles: dict[str, dict[str, float]] = {}

        def submit(pool: ProcessPoolExecutor, name: str, shares: dict[str, float], seed: int, on: Path):
            """Pack `shares` with the recipe's seed + `seed` (each source's document order) and train
            with `seed` (initialisation) under work/runs/`name`, scored on the neutral set at `on`."""
            folder = work / "runs" / name
            pack_candidate(
                shards, shares, vocab, eos, dataclasses.replace(recipe, seed=recipe.seed + seed), folder
            )
            runs[name] = folder / "run"
            return pool.submit(train_proxy, str(folder), str(on), [*options, "--seed", str(seed)])

        searches: list[dict] = []
        deciding: dict[str, object] = {}  # run name -> future of the deciding replicas, all seeds
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(search.parallel, mp_context=context, initializer=_worker_setup) as pool:
            for seed in range(args.seeds):
                # Search seed s: the design drawn with seed s, the swarm trained with seed s.
                seeded = dataclasses.replace(search, seed=search.seed + seed)
                shares_CS = sample_candidates(weights, capacity, budget, recipe.max_epochs, seeded)
                names = [f"s{seed}/c{i:03d}" for i in range(len(shares_CS))]
                futures = {
                    n: submit(pool, n, dict(zip(sources, map(float, row), strict=True)), seed, swarm_dir)
                    for n, row in zip(names, shares_CS, strict=True)
                }
                profiles |= {name: future.result() for name, future in futures.items()}
                losses = {s: np.array([per_source_losses(runs[n])[s] for n in names]) for s in sources}
                losses[AVERAGE] = np.mean([losses[s] for s in sources], axis=0)
                fit = fit_regressions(sources, shares_CS, losses)
                print(f"search seed {seed} ({seeded.design} design):")
                for name, row, loss, loo in zip(
                    names, shares_CS, losses[AVERAGE], fit.loo_predictions, strict=True
                ):
                    shown = " ".join(f"{s}={share:.3f}" for s, share in zip(sources, row, strict=True))
                    print(f"{name}: {shown}  bits/byte {loss:.4f}  leave-one-out predicted {loo:.4f}")
                print("leave-one-out RMSE: " + ", ".join(f"{m} {e:.4f}" for m, e in fit.loo_rmse.items()))
                proposal = propose(fit, weights, capacity, budget, recipe.max_epochs, seeded)
                print(config_snippet(proposal))
                (work / "runs" / f"s{seed}" / "swarm.json").write_text(
                    json.dumps(
                        {
                            "names": names,
                            "sources": sources,
                            "shares": shares_CS.tolist(),
                            "losses": {k: v.tolist() for k, v in losses.items()},
                            "proposal": proposal.shares,
                        }
                    )
                )
                searches.append(
                    {"seed": seed, "names": names, "fit": fit, "proposal": proposal, "losses": losses}
                )
                # The deciding replicas: the proposal's (replica r trained with seed r) and, once for
                # every search, the configured mixture's, paired with them by r. Not waited for: the
                # next search's swarm queues behind them and keeps both workers busy.
                wave = {replica_name(f"s{seed}/{PROPOSAL}", r): (proposal.shares, r) for r in replica_seeds}
                if seed == 0:
                    wave |= {replica_name(CONFIGURED, r): (configured, r) for r in replica_seeds}
                deciding |= {
                    name: submit(pool, name, shares, r, neutral_dir) for name, (shares, r) in wave.items()
                }
            profiles |= {name: future.result() for name, future in deciding.items()}

        def replicas(name: str, swarm_only: bool = False) -> list:
            tables = [pq.read_table(runs[replica_name(name, r)] / EVAL_DOCUMENTS_FILE) for r in replica_seeds]
            if swarm_only:
                tables = [t.filter(is_in(t["id"], value_set=pa.array(sorted(swarm_ids)))) for t in tables]
            return tables

        configured_runs = replicas(CONFIGURED)
        configured_swarm = mean_document_losses(replicas(CONFIGURED, swarm_only=True))
        spreads = (
            [np.var(average_bits_per_byte(configured_runs)[0], ddof=1)] if search.final_seeds > 1 else []
        )
        for searched in searches:
            name = f"s{searched['seed']}/{PROPOSAL}"
            # Achieved against predicted on the swarm's documents, the ones the fit's target was scored on.
            finals = [configured_swarm, mean_document_losses(replicas(name, swarm_only=True))]
            points, own, _ = average_bits_per_byte(finals)
            # The gain on the whole neutral set, replicas paired by training seed.
            proposal_runs = replicas(name)
            gain = gain_of_replicas(configured_runs, proposal_runs)
            whole = average_bits_per_byte(
                [mean_document_losses(r) for r in (configured_runs, proposal_runs)]
            )[0]
            if search.final_seeds > 1:
                spreads.append(np.var(average_bits_per_byte(proposal_runs)[0], ddof=1))
            names = searched["names"]
            jobs = [profiles[n] for n in [*names, *(replica_name(name, r) for r in replica_seeds)]]
            searched |= {
                "configured": points[0],
                "configured_all": whole[0],
                "proposal_all": whole[1],
                "achieved": points[1],
                "achieved_ci": own[1],
                "gain": gain,
                "swarm_s": max(profiles[n]["ended"] for n in names)
                - min(profiles[n]["began"] for n in names),
                "wall_s": max(j["ended"] for j in jobs) - min(j["began"] for j in jobs),
            }
            proposal = searched["proposal"]
            low, high = proposal.predicted_interval
            print(
                f"search seed {searched['seed']}: spearman_loo {searched['fit'].spearman_loo:.3f}, proposal "
                f"predicted {proposal.predicted:.4f} ({low:.4f}-{high:.4f}), achieved {points[1]:.4f} on the "
                f"swarm's documents; on all {configured_runs[0].num_rows} neutral documents: configured "
                f"{whole[0]:.4f}, proposal {whole[1]:.4f}, gain {gain.gain:+.4f} "
                f"({gain.ci[0]:+.4f} to {gain.ci[1]:+.4f}; "
                f"documents' noise alone {gain.documents_ci[0]:+.4f} to {gain.documents_ci[1]:+.4f}; per "
                "replica " + ", ".join(f"{g:+.4f}" for g in gain.per_seed) + ")"
            )
        # One proxy's training noise: the spread of each deciding mixture's replicas about their mean, pooled.
        seed_sd = float(np.sqrt(np.mean(spreads))) if spreads else None
    configured_jobs = [profiles[replica_name(CONFIGURED, r)] for r in replica_seeds]
    swarm = [profiles[n] for searched in searches for n in searched["names"]]
    rho = np.array([searched["fit"].spearman_loo for searched in searches])
    proposals = [{s: round(v, 3) for s, v in searched["proposal"].shares.items()} for searched in searches]
    wall_s = time.perf_counter() - started

    def each(get) -> list:
        return [get(searched) for searched in searches]

    result = {
        "bench": "mixture_search",
        "seeds": args.seeds,
        "candidates": search.candidates,
        "steps": search.steps,
        "concentration": search.concentration,
        "design": search.design,
        "preset": preset,
        "params": int(swarm[0]["params"]),
        "final_seeds": search.final_seeds,
        # Every search seed's figure, then the median, the worst and the spread between the seeds.
        "spearman_loo": _round(rho, 3),
        "spearman_loo_median": round(float(np.median(rho)), 3),
        "spearman_loo_min": round(float(rho.min()), 3),
        "spearman_loo_max": round(float(rho.max()), 3),
        "spearman_loo_iqr": _round(np.percentile(rho, [25, 75]), 3),
        "model": each(lambda x: x["fit"].model_name),
        "loo_rmse": each(lambda x: {m: round(e, 4) for m, e in x["fit"].loo_rmse.items()}),
        "spread": each(lambda x: round(float(np.std(x["losses"][AVERAGE], ddof=1)), 4)),
        "proposals": proposals,
        "proposal_spread": round(proposal_spread(proposals), 3),
        "predicted": each(lambda x: round(x["proposal"].predicted, 4)),
        "predicted_interval": each(lambda x: _round(x["proposal"].predicted_interval)),
        "achieved": each(lambda x: round(x["achieved"], 4)),
        "validation_error": each(lambda x: round(x["achieved"] - x["proposal"].predicted, 4)),
        "validation_error_ci": each(
            lambda x: _round([x["achieved"] - v for v in reversed(x["proposal"].predicted_interval)])
        ),
        "achieved_ci": each(lambda x: _round(x["achieved_ci"])),
        "inside_predicted_interval": each(
            lambda x: (
                x["proposal"].predicted_interval[0] <= x["achieved"] <= x["proposal"].predicted_interval[1]
            )
        ),
        "configured": round(searches[0]["configured"], 4),
        "neutral_documents": configured_runs[0].num_rows,
        "swarm_documents": len(swarm_ids),
        "configured_all": round(searches[0]["configured_all"], 4),
        "proposal_all": each(lambda x: round(x["proposal_all"], 4)),
        "gain_vs_configured": each(lambda x: round(x["gain"].gain, 4)),
        "gain_vs_configured_ci": each(lambda x: _round(x["gain"].ci)),
        "gain_vs_configured_ci_documents": each(lambda x: _round(x["gain"].documents_ci)),
        "gain_per_seed": each(lambda x: _round(x["gain"].per_seed)),
        "gain_seed_share": each(lambda x: round(x["gain"].seed_share, 3)),
        "gain_resolved": each(lambda x: x["gain"].resolved),
        "seed_sd": None if seed_sd is None else round(seed_sd, 4),
        "profile": {
            key: round(float(np.mean([p[key] for p in swarm])), 2)
            for key in ("train_s", "eval_s", "steps_per_s")
        },
        "build_s": round(build_s, 1),
        "swarm_s": each(lambda x: round(x["swarm_s"], 1)),
        # Each search's span from its first proxy's start to its last deciding replica's end (the next
        # search's swarm overlaps the end of it); the configured replicas, shared by every search, apart.
        "seed_wall_s": each(lambda x: round(x["wall_s"], 1)),
        "configured_s": round(
            max(j["ended"] for j in configured_jobs) - min(j["began"] for j in configured_jobs), 1
        ),
        "wall_s": round(wall_s, 1),
        "wall_s_per_seed": round(wall_s / args.seeds, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
