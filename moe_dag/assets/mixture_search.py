"""The mixture search as its own asset group and job (`moe-dag search-mixture`; never part of `moe-dag
run`): a swarm of small proxies, one per candidate mixture, a regression from weights to neutral-set
bits per byte, the proposed mixture and a proxy that validates it. See moe_dag/mixture/search.py.

- `mixture_candidates`: N mixtures sampled around the configured weights within the epoch caps, plus
  the configured mixture itself; each becomes a dynamic partition of `candidate_proxy`.
- `candidate_proxy` (one partition per candidate): the curated token shards packed to the candidate's
  weights (nothing tokenised again), a small proxy trained on them and scored on the neutral set. A
  failed candidate reruns alone; backfilled from the UI, candidates run as concurrent runs within the
  `proxy_swarm` pool (one per GPU; `moe-dag search-mixture` sets its limit to mixture_search.parallel).
- `mixture_proposal`: the regression, chosen by leave-one-out error, and the proposal as a config snippet.
- `mixture_validation`: a proxy trained on the proposal, against the configured mixture's.
- `mixture_search_report`: the `mixture_search` table in the lake and the catalog.
"""

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moe_dag.assets.evaluation import evaluation_set_dirs
from moe_dag.assets.mixture import TOKENIZER_FILE, TOKENS_STAGE
from moe_dag.assets.operating import operated
from moe_dag.assets.resources import PipelineResource
from moe_dag.assets.training_runs import launch_training, run_dir_for
from moe_dag.config import TrainingLaunchConfig
from moe_dag.mixture import SourceTokens, TokenShard
from moe_dag.mixture.neutral import NEUTRAL_SET, NEUTRAL_STAGE
from moe_dag.mixture.search import (
    AVERAGE,
    check_neutral_documents,
    config_snippet,
    fit_regressions,
    pack_candidate,
    propose,
    replica_name,
    results_table,
    sample_candidates,
    shares_of,
)
from moe_dag.mixture.tokenizer import eos_id, load_tokenizer
from moe_dag.operations.plots import bars_png, png_markdown, scatter_png
from moe_dag.settings.training import mixture_search_settings
from moe_dag.training.compare import average_bits_per_byte, gain_of_replicas, mean_document_losses
from moe_dag.training.evaluate import EVAL_DOCUMENTS_FILE, EVAL_FILE

GROUP = "mixture_search"
POOL = "proxy_swarm"
CANDIDATES = dg.DynamicPartitionsDefinition(name="mixture_candidate")
CONFIGURED = "configured"  # the configured weights, trained like every candidate: the baseline
PROPOSAL = "proposal"
STARTED_BY = "moe-dag search-mixture"
SEARCH_TABLE = "mixture_search"


def _search_dir(pipeline: PipelineResource) -> Path:
    return pipeline.lake.artifact_dir("mixture_search")


def _shards(pipeline: PipelineResource) -> dict[str, SourceTokens]:
    """Every source's token shards as `tokenized_mixture` left them in the lake."""
    shards = {}
    for name in sorted(mixture_search_settings(pipeline.config).sources):
        folder = pipeline.lake.local_slice(TOKENS_STAGE, name)
        keys = sorted(path.name.removesuffix(".index.parquet") for path in folder.glob("*.index.parquet"))
        if not keys:
            raise dg.Failure(
                f"no token shards for source {name!r} in {folder}: materialise tokenized_mixture"
            )
        shards[name] = SourceTokens(name, [TokenShard.open(folder, key) for key in keys])
    return shards


def swarm_launch(pipeline: PipelineResource, seed: int = 0) -> TrainingLaunchConfig:
    """The swarm's proxy: mixture_search's preset (else the training section's) with its steps and
    overrides, one process, one checkpoint, and the cores shared by the proxies trained at once; `seed`
    added to the training seed (a replica of a deciding proxy)."""
    settings = mixture_search_settings(pipeline.config)
    search, launch = settings.search, settings.training
    threads = max(1, (os.cpu_count() or 1) // search.parallel)
    swarm = {"parallel.ep": 1, "train.checkpoint_every": search.steps, "train.num_threads": threads}
    overrides = {**swarm, **search.overrides}
    if search.preset is None:  # the training section's model, with its overrides
        overrides = {**launch.overrides, **overrides}
    return dataclasses.replace(
        launch,
        preset=search.preset or launch.preset,
        steps=search.steps,
        seed=launch.seed + seed,
        nproc_per_node=1,
        overrides=overrides,
    )


def _budget(pipeline: PipelineResource, launch: TrainingLaunchConfig) -> int:
    train = launch.resolved.train
    seq_len = mixture_search_settings(pipeline.config).mixture.seq_len
    return launch.steps * train.batch_size * train.grad_accum_steps * (seq_len + 1)


def _capacity(shards: dict[str, SourceTokens]) -> dict[str, int]:
    return {name: int(tokens.lengths.sum()) for name, tokens in shards.items()}


def _neutral_dir(pipeline: PipelineResource) -> Path:
    """The tokenised neutral set the proxies are scored on."""
    evaluation = mixture_search_settings(pipeline.config).evaluation
    neutral = evaluation_set_dirs(pipeline.lake, evaluation).get(NEUTRAL_SET)
    if neutral is None:
        raise dg.Failure("the mixture search scores on the neutral set: set evaluation.neutral_share > 0")
    return neutral


def _check_neutral_set(pipeline: PipelineResource) -> None:
    """Before anything trains: the neutral set exists and holds enough documents of every source."""
    settings, lake = mixture_search_settings(pipeline.config), pipeline.lake
    _neutral_dir(pipeline)
    if not lake.has_table(NEUTRAL_STAGE):
        raise dg.Failure(f"{lake.dataset_dir(NEUTRAL_STAGE)} holds no parquet: materialise {NEUTRAL_STAGE}")
    sources = lake.read_table(NEUTRAL_STAGE, columns=["source"])["source"]
    counts = {row["values"]: row["counts"] for row in pc.value_counts(sources).to_pylist()}
    try:
        check_neutral_documents(counts, list(settings.sources), settings.search.min_neutral_documents)
    except ValueError as error:
        raise dg.Failure(str(error)) from error


def _read(path: Path) -> Any:
    if not path.exists():
        raise dg.Failure(f"{path} not found: materialise the mixture search's assets in order")
    return json.loads(path.read_text())


@dg.asset(
    group_name=GROUP,
    kinds={"numpy"},
    deps=["tokenized_mixture", "evaluation_sets"],
    metadata=operated(1, mixture_search_settings, started_by=STARTED_BY),
)
def mixture_candidates(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """The candidate mixtures, sampled around the configured weights within the epoch caps, and the
    configured mixture; registered as the partitions of `candidate_proxy`."""
    settings = mixture_search_settings(pipeline.config)
    _check_neutral_set(pipeline)
    shards = _shards(pipeline)
    budget = _budget(pipeline, swarm_launch(pipeline))
    shares_CS = sample_candidates(
        settings.mixture.weights, _capacity(shards), budget, settings.mixture.max_epochs, settings.search
    )
    sources = sorted(shards)
    candidates = {CONFIGURED: shares_of(settings.mixture.weights)}
    candidates |= {
        f"c{i:03d}": dict(zip(sources, map(float, row), strict=True)) for i, row in enumerate(shares_CS)
    }
    folder = _search_dir(pipeline)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "candidates.json").write_text(
        json.dumps({"budget": budget, "candidates": candidates}, indent=2)
    )
    pipeline.lake.publish_artifact("mixture_search")
    instance = context.instance
    stale = set(instance.get_dynamic_partitions(CANDIDATES.name)) - set(candidates)
    for key in sorted(stale):
        instance.delete_dynamic_partition(CANDIDATES.name, key)
    instance.add_dynamic_partitions(CANDIDATES.name, sorted(candidates))
    plot = bars_png(
        list(candidates), {s: [c[s] for c in candidates.values()] for s in sources}, "share", "candidates"
    )
    return dg.MaterializeResult(
        metadata={
            "candidates": len(candidates) - 1,
            "token_budget": budget,
            "shares": dg.MetadataValue.json(candidates),
            "plot": dg.MetadataValue.md(png_markdown(plot, "candidate shares")),
        }
    )


def _train_on(
    context: dg.AssetExecutionContext,
    pipeline: PipelineResource,
    name: str,
    shares: dict[str, float],
    seed: int = 0,
) -> dict[str, Any]:
    """Pack `shares` from the curated shards, train a swarm proxy on them, score it on the neutral set.
    `seed` (0 for the swarm) moves the initialisation and every source's document order together."""
    lake, folder = pipeline.lake, _search_dir(pipeline)
    settings = mixture_search_settings(pipeline.config)
    neutral = _neutral_dir(pipeline)
    tokenizer = load_tokenizer(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    launch, mixture = swarm_launch(pipeline, seed), settings.mixture
    recipe = dataclasses.replace(mixture, total_tokens=_budget(pipeline, launch), seed=mixture.seed + seed)
    data_dir = folder / "mixtures" / name
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    packed = pack_candidate(
        _shards(pipeline), shares, vocab, eos_id(tokenizer, recipe.eos_token), recipe, data_dir
    )
    run_dir = run_dir_for(data_dir, launch, folder / "runs" / name)
    launch_training(context, launch, data_dir, run_dir, neutral, config_digest=pipeline.config_digest)
    report = json.loads((run_dir / EVAL_FILE).read_text())
    per_source = {source: figures["bits_per_byte"] for source, figures in report["sources"].items()}
    achieved = {s: packed["sources"][s]["achieved_share"] for s in sorted(shares)}
    result = {
        "shares": shares,
        "achieved_shares": achieved,
        "bits_per_byte": per_source,
        AVERAGE: float(np.mean(list(per_source.values()))),
        "seed": seed,
        "run_dir": str(run_dir),
    }
    (folder / "results").mkdir(parents=True, exist_ok=True)
    (folder / "results" / f"{name}.json").write_text(json.dumps(result, indent=2))
    lake.publish_artifact("mixture_search")
    return result


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch"},
    deps=["mixture_candidates"],
    partitions_def=CANDIDATES,
    pool=POOL,
    metadata=operated(2, mixture_search_settings, started_by=STARTED_BY),
)
def candidate_proxy(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """One candidate's small proxy, trained on the curated token shards packed to its weights and scored
    on the neutral set in bits per byte per source."""
    name = context.partition_key
    shares = _read(_search_dir(pipeline) / "candidates.json")["candidates"][name]
    result = _train_on(context, pipeline, name, shares)
    return dg.MaterializeResult(
        metadata={
            "shares": dg.MetadataValue.json(result["achieved_shares"]),
            "bits_per_byte": dg.MetadataValue.json(result["bits_per_byte"]),
            "average_bits_per_byte": result[AVERAGE],
            "run_dir": dg.MetadataValue.path(result["run_dir"]),
        }
    )


@dg.asset(
    group_name=GROUP,
    kinds={"sklearn"},
    deps=["candidate_proxy"],
    metadata=operated(1, mixture_search_settings, started_by=STARTED_BY),
)
def mixture_proposal(pipeline: PipelineResource) -> dg.MaterializeResult:
    """The regression from shares to neutral bits per byte (per source and averaged), its model chosen by
    leave-one-out error, and the proposed mixture with its predicted interval, as a config snippet."""
    settings, folder = mixture_search_settings(pipeline.config), _search_dir(pipeline)
    names = sorted(n for n in _read(folder / "candidates.json")["candidates"] if n != CONFIGURED)
    results = [_read(folder / "results" / f"{name}.json") for name in names]
    sources = sorted(results[0]["achieved_shares"])
    # The shares the proxies were trained on: a capped source can fall short of the sampled ones.
    shares_CS = np.array([[r["achieved_shares"][s] for s in sources] for r in results])
    losses = {s: np.array([r["bits_per_byte"][s] for r in results]) for s in sources}
    losses[AVERAGE] = np.array([r[AVERAGE] for r in results])
    fit = fit_regressions(sources, shares_CS, losses)
    capacity = _capacity(_shards(pipeline))
    budget = _read(folder / "candidates.json")["budget"]
    proposal = propose(
        fit, settings.mixture.weights, capacity, budget, settings.mixture.max_epochs, settings.search
    )
    snippet = config_snippet(proposal)
    pq.write_table(results_table(names, sources, shares_CS, losses, fit), folder / "candidates.parquet")
    (folder / "proposal.yaml").write_text(snippet)
    (folder / "proposal.json").write_text(
        json.dumps(
            {
                "shares": proposal.shares,
                "predicted": proposal.predicted,
                "predicted_interval": proposal.predicted_interval,
                "predicted_sources": proposal.predicted_sources,
                "model": fit.model_name,
                "loo_rmse": fit.loo_rmse,
                "target_loo_rmse": fit.target_loo_rmse,
                "spearman_loo": fit.spearman_loo,
                "failed": fit.failed,
            },
            indent=2,
        )
    )
    pipeline.lake.publish_artifact("mixture_search")
    low, high = (
        float(min(losses[AVERAGE].min(), fit.loo_predictions.min())),
        float(max(losses[AVERAGE].max(), fit.loo_predictions.max())),
    )
    margin = (high - low) * 0.1 or 0.01
    scatter = scatter_png(
        fit.loo_predictions.tolist(),
        losses[AVERAGE].tolist(),
        "predicted (leave one out)",
        "achieved",
        "average neutral bits per byte",
        (low - margin, high + margin),
    )
    configured = shares_of(settings.mixture.weights)
    weights = bars_png(
        sources,
        {"configured": [configured[s] for s in sources], "proposal": [proposal.shares[s] for s in sources]},
        "share",
        "mixture weights",
    )
    return dg.MaterializeResult(
        metadata={
            "model": fit.model_name,
            "loo_rmse": dg.MetadataValue.json(fit.loo_rmse),
            "spearman_loo": fit.spearman_loo,
            # Families left out of the choice, each with why its fit failed: an empty choice reads
            # differently when a family could not be fitted than when it lost on leave-one-out error.
            "failed": dg.MetadataValue.json(fit.failed),
            "predicted": proposal.predicted,
            "predicted_interval": dg.MetadataValue.json(list(proposal.predicted_interval)),
            "proposal": dg.MetadataValue.json(proposal.shares),
            "config_snippet": dg.MetadataValue.md(f"```yaml\n{snippet}```"),
            "predicted_vs_achieved": dg.MetadataValue.md(png_markdown(scatter, "predicted vs achieved")),
            "weights": dg.MetadataValue.md(png_markdown(weights, "configured vs proposed weights")),
        }
    )


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch"},
    deps=["mixture_proposal"],
    pool=POOL,
    metadata=operated(2, mixture_search_settings, started_by=STARTED_BY),
)
def mixture_validation(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Proxies trained on the proposal, scored on the neutral set against its prediction and against the
    configured mixture's; both over mixture_search.final_seeds seeds, paired by seed and by neutral
    document, the gain's interval counting the documents' and the seeds' noise (compare.paired_gain)."""
    folder, search = _search_dir(pipeline), mixture_search_settings(pipeline.config).search
    proposal = _read(folder / "proposal.json")
    configured_shares = _read(folder / "candidates.json")["candidates"][CONFIGURED]
    seeds = range(search.final_seeds)
    runs = {
        PROPOSAL: [
            _train_on(context, pipeline, replica_name(PROPOSAL, s), proposal["shares"], s) for s in seeds
        ],
        CONFIGURED: [_read(folder / "results" / f"{CONFIGURED}.json")]
        + [
            _train_on(context, pipeline, replica_name(CONFIGURED, s), configured_shares, s) for s in seeds[1:]
        ],
    }
    tables = {
        name: [pq.read_table(Path(r["run_dir"]) / EVAL_DOCUMENTS_FILE) for r in results]
        for name, results in runs.items()
    }
    points, own, _ = average_bits_per_byte([mean_document_losses(tables[n]) for n in (CONFIGURED, PROPOSAL)])
    gain = gain_of_replicas(tables[CONFIGURED], tables[PROPOSAL])
    low, high = proposal["predicted_interval"]
    validation = {
        "final_seeds": search.final_seeds,
        "achieved": points[1],
        "achieved_ci": own[1],
        "validation_error": points[1] - proposal["predicted"],
        "validation_error_ci": [points[1] - high, points[1] - low],
        "inside_predicted_interval": low <= points[1] <= high,
        "configured": points[0],
        "gain_vs_configured": gain.gain,
        # Documents' and seeds' noise (compare.paired_gain); the documents' alone beside it.
        "gain_vs_configured_ci": gain.ci,
        "gain_vs_configured_ci_documents": gain.documents_ci,
        "gain_per_seed": gain.per_seed,
        "gain_resolved": gain.resolved,
    }
    if search.final_seeds > 1:  # one proxy's training noise: its replicas' spread, pooled over both
        spreads = [np.var(average_bits_per_byte(t)[0], ddof=1) for t in tables.values()]
        validation["seed_sd"] = float(np.sqrt(np.mean(spreads)))
    (folder / "validation.json").write_text(json.dumps(validation, indent=2))
    pipeline.lake.publish_artifact("mixture_search")
    return dg.MaterializeResult(
        metadata={
            key: dg.MetadataValue.json(value) if isinstance(value, (list, tuple)) else value
            for key, value in validation.items()
        }
    )


@dg.asset(
    group_name=GROUP,
    kinds={"duckdb"},
    deps=["mixture_validation"],
    pool="duckdb_catalog",
    metadata=operated(2, mixture_search_settings, started_by=STARTED_BY),
)
def mixture_search_report(pipeline: PipelineResource) -> dg.MaterializeResult:
    """One row per trained mixture (candidates, the configured one, the proposal) in the lake's
    `mixture_search` table and the catalog's view of it."""
    folder = _search_dir(pipeline)
    candidates = pq.read_table(folder / "candidates.parquet")
    proposal, validation = _read(folder / "proposal.json"), _read(folder / "validation.json")
    extra, roles = [], []
    seeds = range(mixture_search_settings(pipeline.config).search.final_seeds)
    for role, predicted in ((CONFIGURED, None), (PROPOSAL, proposal["predicted"])):
        for seed in seeds:
            result = _read(folder / "results" / f"{replica_name(role, seed)}.json")
            row: dict[str, Any] = {"candidate": replica_name(role, seed)}
            row |= {f"share_{s}": v for s, v in result["achieved_shares"].items()}
            row |= {f"bits_per_byte_{s}": v for s, v in result["bits_per_byte"].items()}
            extra.append(row | {"bits_per_byte_average": result[AVERAGE], "loo_predicted_average": predicted})
            roles.append((role, seed))
    table = pa.concat_tables([candidates, pa.Table.from_pylist(extra, schema=candidates.schema)])
    table = table.append_column("role", pa.array(["candidate"] * candidates.num_rows + [r for r, _ in roles]))
    table = table.append_column(
        "seed", pa.array([0] * candidates.num_rows + [s for _, s in roles], pa.int64())
    )
    pipeline.lake.write_table(table, SEARCH_TABLE)
    pipeline.catalog.refresh({SEARCH_TABLE: False})
    return dg.MaterializeResult(
        metadata={
            "rows": table.num_rows,
            "spearman_loo": proposal["spearman_loo"],
            "gain_vs_configured": validation["gain_vs_configured"],
            "gain_vs_configured_ci": dg.MetadataValue.json(validation["gain_vs_configured_ci"]),
        }
    )


mixture_search_job = dg.define_asset_job(
    "mixture_search",
    selection=dg.AssetSelection.groups(GROUP),
    description="The mixture search: candidates, one proxy per candidate partition, regression, proposal, "
    "validation (moe-dag search-mixture runs it in that order, the candidates concurrently).",
)
