"""Curation's gain on text it did not choose: the curated and the unfiltered proxy at the demo budget,
over seeds, scored on the neutral set and on the curated held-out documents.

Baseline: `unfiltered`, the demo's proxy trained for the same steps on the unfiltered mixture (every
ingested document, the evaluation sets and their copies left out), as the `curation_gain` asset trains it.

The curated held-out documents were drawn from what the filters kept, so they favour the curated
mixture by construction; the neutral set (moe_dag/mixture/neutral.py) was drawn from the raw documents
before any filter, so it is the one that says whether curation helps a model on text in general.

How, on the library's own code: the demo graph through `materialize_all` on configs/demo.yaml with its
lake, catalog and corpus in a temporary folder (benchmarks/incremental.py's config; the comparisons off),
which gives the curated mixture, the neutral set and the curated proxy of the config's seed
(`moe_proxy`); the unfiltered mixture by `build_unfiltered_mixture` (what the `unfiltered_mixture` asset
calls); then for every other (seed, mixture) the trainer's command line with the demo's resolved training
config and `train.seed` = seed (what `moe_proxy` and `curation_gain` launch, without Dagster Pipes); every
run scored at its last two checkpoints (`--checkpoints`) by `evaluate_on_sets` on both sets, as the asset
scores them.

Per set: the gain (unfiltered bits per byte - curated, averaged over sources; positive: curation helps)
from the runs paired by seed and by document (`compare.paired_gain`: the interval counts the documents'
noise and the seeds' noise), each seed's gain and their median, and the asset's one-sentence verdict
(`compare.verdict`: resolved, or the steps the trend between the two checkpoints says would resolve it).
Where the curated model does worse, on the neutral set: the gain per source, per fate (what the curation
decided about each neutral document: the stage that would have dropped it, or `kept`), and the documents
with the largest loss in bits.

`--ablate STAGE ...` (prefilter, dedup, toxicity, quality): the same proxy with one stage removed at a
time, seeds as above. Its mixture is the unfiltered mixture's path with every document another stage
dropped also left out (`build_unfiltered_mixture(dropped=...)`): what the curation keeps plus what that
stage alone dropped. A stage only decides what the stages before it kept, so the documents an early
stage dropped come back unjudged by the later ones: an upper bound on what removing it puts back. Per
stage its gain on the neutral set (the proxy without it minus the curated proxy; positive: the stage
helps) with interval and verdict, and how many documents it dropped (`documents_dropped`). The ablations
are scored on the neutral set only (the curated held-out documents favour every curation alike), and at
the last checkpoint only: on 2 CPU cores scoring the neutral set takes longer than training (one raw
document of the demo corpus is most of its tokens), so their verdicts name no trend.

JSON: `bench`, `seeds`, `steps`, `tokens`, `gain_neutral`, `gain_neutral_ci`, `gain_heldout`,
`gain_heldout_ci`, and per set (`gain_neutral_...`, `gain_heldout_...`) `per_seed`, `median`,
`ci_documents` (the documents' noise alone), `seed_share`, `resolved`, `steps_to_resolve`, `verdict`;
then `neutral_documents`, `heldout_documents`, `by_source` (per set and source: documents, bytes, both
models' bits per byte, the gain and its interval, and each document counting once the median document
gain and `curated_better_share`), `neutral_by_fate` (the same per fate), `worst_documents`, `ablation`
(with `--ablate`), `build_s`, `train_s` (one proxy's training, mean), `wall_s`.

    .venv/bin/python -m benchmarks.curation_gain [--seeds 2] [--checkpoints 2]
        [--ablate prefilter dedup toxicity quality] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import yaml

from benchmarks._smoke import parse_with_smoke
from benchmarks.incremental import demo_config
from moe_dag.assets.training_runs import RUN_CONFIG_FILE, latest_run, run_dir_for, write_run_config
from moe_dag.config import TrainingLaunchConfig, load_config
from moe_dag.curation.demo_corpus import DemoCorpusConfig, build_demo_corpus
from moe_dag.curation.fits import decisions
from moe_dag.engine import run_stage
from moe_dag.mixture.curated import MIXTURE_STAGE
from moe_dag.mixture.neutral import NEUTRAL_SET, NEUTRAL_STAGE
from moe_dag.mixture.unfiltered import build_unfiltered_mixture
from moe_dag.orchestration.pipeline import materialize_all
from moe_dag.storage.lake import Lake
from moe_dag.training.checkpoint import list_checkpoints
from moe_dag.training.compare import (
    compare_runs,
    gain_of_replicas,
    mean_document_losses,
    read_document_losses,
    verdict,
)
from moe_dag.training.eval_sets import evaluate_on_sets, set_folder

CURATED, UNFILTERED = "curated", "unfiltered"
HELDOUT_SET = "curated"  # the curated mixture's held-out documents, as the asset names the set
SETS = {NEUTRAL_SET: "neutral", HELDOUT_SET: "heldout"}  # set -> its name in the JSON keys
# The curation's deciding stages in graph order: the name an ablation removes -> the stage's lake table.
STAGES = {
    "prefilter": "prefiltered",
    "dedup": "deduplicated",
    "toxicity": "toxicity_filtered",
    "quality": "scored_documents",
}
LAST_STAGE = "scored_documents"
KEPT = "kept"  # the fate of a document every stage kept
WORST = 10  # documents listed in `worst_documents`
SUMMARY_FILE = "summary.json"  # what the trainer writes when a run finishes


def build_lake(folder: Path, smoke: bool) -> tuple[Path, Lake, list[str]]:
    """The demo graph materialised under `folder` (its corpus built first): config path, lake, sources.
    The Dagster instance lives in `folder` too, so a second run in a kept folder redoes only what is
    stale; with `refresh`, the mixture and `moe_proxy` follow any new curation decisions (code edited
    since), which a refresh policy would otherwise leave for later, so the curated mixture is always the
    one the stages' decisions give."""
    config_path = demo_config(folder, smoke)
    raw = yaml.safe_load(config_path.read_text())
    if not (folder / "corpus").exists():
        build_demo_corpus(folder / "corpus", DemoCorpusConfig(**raw["demo_corpus"]))
    (folder / "dagster").mkdir(exist_ok=True)
    instance = dg.DagsterInstance.local_temp(str(folder / "dagster"))
    materialize_all(str(config_path), instance=instance, comparisons=False, refresh=True)
    return config_path, Lake(raw["lake_root"]), [source["name"] for source in raw["sources"]]


def curation_fates(lake: Lake, sources: list[str]) -> dict[str, tuple[str, str | None]]:
    """id -> (the stage that dropped the document, its reason), or (`kept`, None) past every stage.
    A stage decides only what the stages before it kept, so each document has one fate."""
    fates: dict[str, tuple[str, str | None]] = {}
    for source in sources:
        for name, stage in STAGES.items():
            table = decisions(lake, stage, source)
            for doc_id, keep, reason in zip(
                *(table[c].to_pylist() for c in ("id", "keep", "reason")), strict=True
            ):
                if not keep:
                    fates[doc_id] = (name, reason)
                elif stage == LAST_STAGE:
                    fates[doc_id] = (KEPT, None)
    return fates


def mixture_without(
    lake: Lake, config_path: Path, sources: list[str], dropped: frozenset[str], out: Path
) -> Path:
    """The unfiltered mixture's documents less `dropped` ids, packed to the curated recipe, copied to `out`
    (the next build rewrites the lake's folder)."""
    mixture = load_config(config_path).mixture
    built = build_unfiltered_mixture(
        lake, sources, mixture, lambda spec, s, inputs: run_stage(spec, lake, s, inputs, workers=0), dropped
    )
    out.mkdir(parents=True, exist_ok=True)
    # Only the mixture's files: the folder also holds the builder's token shards, which it reuses.
    for path in built.out_dir.iterdir():
        if path.is_file():
            shutil.copy2(path, out / path.name)
    return out


def train_proxy(launch: TrainingLaunchConfig, seed: int, data_dir: Path, runs: Path) -> Path:
    """Train the demo's proxy with `seed` on `data_dir` by the trainer's command line, with the resolved
    config `moe_proxy` hands it, in the folder under `runs` that `moe_proxy` would name (a digest of the
    mixture and the config). A finished run there (a kept folder's) is reused; a cut one resumes."""
    seeded = launch.with_overrides({"train.seed": seed})
    out = run_dir_for(data_dir, seeded, runs)
    if (out / SUMMARY_FILE).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    write_run_config(seeded, out)
    command = [sys.executable, "-m", "moe_dag.training", "--data", str(data_dir), "--out", str(out)]
    command += ["--config", str(out / RUN_CONFIG_FILE), "--nproc-per-node", str(launch.nproc_per_node)]
    with (out / "train.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}); see {out / 'train.log'}")
    return out


def summary(run: Path) -> dict:
    return json.loads((run / SUMMARY_FILE).read_text())


def losses(runs: list[Path], name: str, step: int) -> list[pa.Table]:
    return [read_document_losses(set_folder(run, name, step)) for run in runs]


def paired(base: list[Path], other: list[Path], name: str, steps: list[int], what: str) -> dict:
    """`other` minus `base` on set `name` (runs paired by seed), at each of `steps` for the verdict's
    trend: gain, interval, per seed and the sentence."""
    by_step = [gain_of_replicas(losses(base, name, step), losses(other, name, step)) for step in steps]
    final = by_step[-1]
    judged = verdict(steps, [gain.gain for gain in by_step], final.ci, what)
    return {
        "gain": round(final.gain, 4),
        "ci": _round(final.ci),
        "ci_documents": _round(final.documents_ci),
        "per_seed": _round(final.per_seed),
        "median": round(float(np.median(final.per_seed)), 4),
        "seed_share": round(final.seed_share, 3),
        "resolved": judged["resolved"],
        "steps_to_resolve": judged["steps_to_resolve"],
        "verdict": judged["sentence"],
    }


def grouped(curated: list[pa.Table], unfiltered: list[pa.Table], groups: list[str] | None = None) -> dict:
    """Per source (or per `groups`, one label a document in the tables' order): both models' bits per
    byte averaged over seeds and the gain with its paired interval over documents, all weighted by bytes;
    and, each document counting once, the median of the documents' gains and the share of documents the
    curated proxy predicts better (one long document can carry a byte-weighted figure alone)."""
    curated_mean, unfiltered_mean = mean_document_losses(curated), mean_document_losses(unfiltered)
    if groups is not None:
        index = curated_mean.schema.get_field_index("source")
        curated_mean = curated_mean.set_column(index, "source", pa.array(groups))
        unfiltered_mean = unfiltered_mean.set_column(index, "source", pa.array(groups))
    bytes_N = curated_mean["num_bytes"].to_numpy()
    gain_N = (
        (unfiltered_mean["nll_nats"].to_numpy() - curated_mean["nll_nats"].to_numpy()) / math.log(2) / bytes_N
    )
    labels_N = np.asarray(curated_mean["source"].to_pylist())
    return {
        group: {
            "documents": figures["documents"],
            "bytes": int(bytes_N[labels_N == group].sum()),
            "curated": round(figures["proxy_bits_per_byte"], 4),
            "unfiltered": round(figures["baseline_bits_per_byte"], 4),
            "gain": round(figures["gain"], 4),
            "gain_ci": _round(figures["gain_ci"]),
            "median_document_gain": round(float(np.median(gain_N[labels_N == group])), 4),
            "curated_better_share": round(float(np.mean(gain_N[labels_N == group] > 0)), 3),
        }
        for group, figures in compare_runs(curated_mean, unfiltered_mean)["sources"].items()
    }


def worst_documents(
    curated: list[pa.Table], unfiltered: list[pa.Table], fates: dict, texts: dict[str, str]
) -> list[dict]:
    """The neutral documents the curated proxy loses most bits on against the unfiltered one (mean over
    seeds), with their fate and how their text starts."""
    curated_mean, unfiltered_mean = mean_document_losses(curated), mean_document_losses(unfiltered)
    lost_N = (curated_mean["nll_nats"].to_numpy() - unfiltered_mean["nll_nats"].to_numpy()) / math.log(2)
    bytes_N = curated_mean["num_bytes"].to_numpy()
    ids, sources = curated_mean["id"].to_pylist(), curated_mean["source"].to_pylist()
    return [
        {
            "id": ids[i],
            "source": sources[i],
            "fate": fates.get(ids[i], ("unknown", None))[0],
            "reason": fates.get(ids[i], ("unknown", None))[1],
            "bytes": int(bytes_N[i]),
            "bits_lost": round(float(lost_N[i]), 1),
            "bits_per_byte_lost": round(float(lost_N[i] / bytes_N[i]), 3),
            "starts": texts.get(ids[i], "")[:80],
        }
        for i in np.argsort(-lost_N)[:WORST]
    ]


def scored_steps(run: Path, checkpoints: int) -> list[int]:
    """The steps of the newest `checkpoints` checkpoints, those `evaluate_on_sets` scores."""
    return [int(checkpoint.name.removeprefix("step_")) for checkpoint in list_checkpoints(run)[-checkpoints:]]


def _round(values, digits: int = 4) -> list[float]:
    return [round(float(v), digits) for v in values]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per mixture (from the config's)")
    parser.add_argument(
        "--ablate", nargs="*", choices=list(STAGES), default=[], help="stages to remove, one at a time"
    )
    # Two, as the asset scores: the verdict reads the gain's trend between them. Scoring the neutral set
    # takes longer than training on 2 loaded cores; one halves it, and the verdict then names no trend.
    parser.add_argument("--checkpoints", type=int, default=2, help="checkpoints scored per run, newest first")
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and leave it (default: a temporary one)"
    )
    args = parse_with_smoke(parser, {"seeds": 2, "ablate": [], "checkpoints": 1})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="moe-dag-curation-gain-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        config_path, lake, sources = build_lake(work, args.smoke)
        launch = load_config(config_path).training
        seeds = [launch.seed + i for i in range(args.seeds)]
        fates = curation_fates(lake, sources)
        mixtures = {
            CURATED: lake.artifact_dir(MIXTURE_STAGE),
            UNFILTERED: mixture_without(
                lake, config_path, sources, frozenset(), work / "mixtures" / UNFILTERED
            ),
        }
        for stage in args.ablate:
            others = frozenset(doc_id for doc_id, (fate, _) in fates.items() if fate not in (stage, KEPT))
            mixtures[f"without_{stage}"] = mixture_without(
                lake, config_path, sources, others, work / "mixtures" / f"without_{stage}"
            )
        build_s = time.perf_counter() - started
        sets = {
            NEUTRAL_SET: lake.artifact_dir("evaluation_sets") / NEUTRAL_SET,
            HELDOUT_SET: lake.artifact_dir(MIXTURE_STAGE),
        }
        runs: dict[str, list[Path]] = {name: [] for name in mixtures}
        # Mixture by mixture, so that the curated and unfiltered runs, the headline, are done first.
        for name, data_dir in mixtures.items():
            for seed in seeds:
                if name == CURATED and seed == launch.seed:
                    run = latest_run(lake.artifact_dir("moe_proxy"))  # the graph's own, this very run
                else:
                    run = train_proxy(launch, seed, data_dir, work / "runs" / name)
                print(f"{name} seed {seed}: trained in {summary(run)['wall_seconds']:.0f} s", flush=True)
                if name in (CURATED, UNFILTERED):
                    evaluate_on_sets(run, sets, checkpoints=args.checkpoints, device="cpu")
                else:
                    # An ablation is read on the neutral set (the held-out set favours every curation
                    # alike) at the budget trained: scoring is most of a run's time on 2 CPU cores.
                    evaluate_on_sets(run, {NEUTRAL_SET: sets[NEUTRAL_SET]}, device="cpu")
                runs[name].append(run)
        steps = sorted(
            set.intersection(
                *(set(scored_steps(run, args.checkpoints)) for run in runs[CURATED] + runs[UNFILTERED])
            )
        )

        trained = [summary(run) for group in runs.values() for run in group]
        result: dict = {
            "bench": "curation_gain",
            "seeds": seeds,
            "steps": trained[0]["steps"],
            "tokens": trained[0]["tokens_seen"],  # the budget each proxy trained on
        }
        for name, key in SETS.items():
            gain = paired(runs[CURATED], runs[UNFILTERED], name, steps, f"curation gain on the {name} set")
            result |= {f"gain_{key}": gain.pop("gain"), f"gain_{key}_ci": gain.pop("ci")}
            result |= {f"gain_{key}_{field}": value for field, value in gain.items()}
            print(result[f"gain_{key}_verdict"])
        final = {name: {s: losses(runs[name], s, steps[-1]) for s in SETS} for name in (CURATED, UNFILTERED)}
        neutral = final[CURATED][NEUTRAL_SET]
        ids = mean_document_losses(neutral)["id"].to_pylist()
        drawn = lake.read_table(NEUTRAL_STAGE, columns=["id", "text"])
        texts = dict(zip(drawn["id"].to_pylist(), drawn["text"].to_pylist(), strict=True))
        result |= {
            "neutral_documents": neutral[0].num_rows,
            "heldout_documents": final[CURATED][HELDOUT_SET][0].num_rows,
            "by_source": {
                key: grouped(final[CURATED][name], final[UNFILTERED][name]) for name, key in SETS.items()
            },
            "neutral_by_fate": grouped(
                neutral,
                final[UNFILTERED][NEUTRAL_SET],
                [fates.get(doc_id, ("unknown",))[0] for doc_id in ids],
            ),
            "worst_documents": worst_documents(neutral, final[UNFILTERED][NEUTRAL_SET], fates, texts),
        }
        if args.ablate:
            result["ablation"] = {
                stage: {
                    # All of them come back but the evaluation documents among them.
                    "documents_dropped": sum(fate == stage for fate, _ in fates.values()),
                    "neutral": paired(
                        runs[CURATED],
                        runs[f"without_{stage}"],
                        NEUTRAL_SET,
                        steps[-1:],
                        f"{stage}'s gain on the neutral set",
                    ),
                }
                for stage in args.ablate
            }
    result |= {
        "build_s": round(build_s, 1),
        "train_s": round(float(np.mean([run["wall_seconds"] for run in trained])), 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
