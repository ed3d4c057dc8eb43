"""Near-duplicate removal: MinHash signatures per source, clusters across all sources, then the cut.

Staying right under partial runs. `dedup_clusters` records a version per source (a fingerprint of that
source's decisions); each `deduplicated` partition stores the version it was built from. Backfilling one
source recomputes its signatures only and re-clusters from the stored signatures of every source; the
`dedup_consistency` sensor then rebuilds exactly the `deduplicated` partitions whose version changed,
and re-clusters first if signatures changed after the last clustering. The blocking
`built_from_current_clusters` check fails on a partition built from other clusters than the current
ones, so its rows do not flow on. After any sequence of per-source backfills the kept set is that of a
full recomputation (tests/test_dedup_backfill.py).

`minhash_signatures` and `deduplicated` run shard by shard on the data-plane engine (one output file
per input shard). The global step reads signature files only, never texts, and runs in partitions as
Ray tasks (`moe_dag/curation/dedup/partitioned.py`); it writes one cluster file per signature shard, so
each `deduplicated` task reads only the cluster rows of the shard it processes.
"""

import dataclasses
import functools
import posixpath
import time

import dagster as dg
import pyarrow as pa

from moe_dag.assets.operating import operated
from moe_dag.assets.partitions import PER_SOURCE
from moe_dag.assets.reporting import (
    DUPLICATE_SHARE,
    decision_check_specs,
    decision_result,
    engine_metadata,
    problems_result,
    run_source_stage,
)
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.curation.dedup import (
    CLUSTER_VERSION,
    built_from_version,
    cluster_partitioned,
    cluster_versions,
    signature_rows,
)
from moe_dag.curation.dedup.clusters import (
    EMPTY_VERSION,
    cluster_row_counts,
    file_built_from_versions,
    file_cluster_version,
)
from moe_dag.curation.dedup.partitioned import CLUSTERS_STAGE, recorded_versions
from moe_dag.curation.dedup.report import DuplicateReport
from moe_dag.curation.work import DedupWork, SignatureWork
from moe_dag.engine import StageSpec
from moe_dag.engine.cluster import cluster_cpus
from moe_dag.engine.shards import upstream_inputs
from moe_dag.engine.tasks import map_tasks
from moe_dag.operations.bounds import cluster_row_violation, stale_deduplicated
from moe_dag.operations.plots import bars_png, png_markdown
from moe_dag.settings.curation import cluster_settings, deduplicated_settings, signature_settings
from moe_dag.settings.stage import work_digest
from moe_dag.storage.lake import Lake

VERSIONS = "cluster_versions"  # dedup_clusters metadata: {source: version}


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet", "ray"},
    deps=["prefiltered"],
    metadata=operated(1, signature_settings),
)
def minhash_signatures(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Exact-content hash and MinHash signature of every document the prefilter kept, one file per shard."""
    settings = signature_settings(pipeline.config, context.partition_key)
    spec = StageSpec(
        outputs=("minhash_signatures",),
        make_work=functools.partial(SignatureWork, settings.dedup),
        params=work_digest(settings),
    )
    run = run_source_stage(context, pipeline, ray, spec, "prefiltered")
    documents = run.counts.get("documents", 0)
    return dg.MaterializeResult(
        metadata={"documents": documents, "dagster/row_count": documents, **engine_metadata(run)}
    )


@dg.asset(
    group_name="curation",
    kinds={"ray", "parquet"},
    deps=["minhash_signatures"],
    # the order of the sources is the survivor priority
    metadata=operated(1, cluster_settings, started_by="dedup_consistency"),
    check_specs=[dg.AssetCheckSpec("one_row_per_document", asset="dedup_clusters", blocking=True)],
)
def dedup_clusters(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """Duplicate clusters across every source, one deterministic survivor each, from signatures only:
    computed in partitions on Ray (`ray.workers` of them at once), one file per signature shard."""
    settings = cluster_settings(pipeline.config)
    started = time.perf_counter()
    files = _signature_files(pipeline.lake, settings.sources)
    result = cluster_partitioned(
        pipeline.lake, settings.sources, settings.dedup, workers=ray.workers or cluster_cpus()
    )
    written = _cluster_files(pipeline.lake)
    report, versions = result.report, result.versions
    previous = _latest_metadata(context.instance, "dedup_clusters").get(VERSIONS)
    changed = sorted(s for s in versions if previous is None or previous.value.get(s) != versions[s])
    context.log.info(
        f"{report.duplicates} duplicates among {result.rows} ({result.candidates} candidate pairs, "
        f"{result.rounds} label rounds); decisions changed in {changed}"
    )
    signatures = signature_rows(files)
    rows, distinct_ids = cluster_row_counts(written)
    return dg.MaterializeResult(
        metadata={
            "documents": rows,
            "duplicates": report.duplicates,
            "cross_source_duplicates": sum(report.across.values()),
            "clusters_with_duplicates": sum(report.cluster_sizes.values()),
            "candidate_pairs": result.candidates,
            "label_rounds": result.rounds,
            VERSIONS: dg.MetadataValue.json(versions),
            "sources_with_changed_decisions": dg.MetadataValue.json(changed),
            **_report_metadata(report),
            "seconds": round(time.perf_counter() - started, 2),
            "dagster/row_count": rows,
        },
        check_results=[
            problems_result(
                "one_row_per_document",
                [problem] if (problem := cluster_row_violation(signatures, rows, distinct_ids)) else [],
                {"signatures": signatures, "cluster_rows": rows, "distinct_ids": distinct_ids},
            )
        ],
    )


def _cluster_files(lake: Lake, source: str | None = None) -> str:
    """A glob over the cluster files (of one source: its shards' files)."""
    return lake.glob_pattern("dedup_clusters", partitioned=False).replace(
        "/*.parquet", f"/{source}.*.parquet" if source else "/*.parquet"
    )


@dg.asset(
    partitions_def=PER_SOURCE,
    group_name="curation",
    kinds={"parquet"},
    deps=["prefiltered", "dedup_clusters"],
    metadata=operated(1, deduplicated_settings, started_by="dedup_consistency"),
    check_specs=decision_check_specs("deduplicated", DUPLICATE_SHARE),
)
def deduplicated(
    context: dg.AssetExecutionContext, pipeline: PipelineResource, ray: RayResource
) -> dg.MaterializeResult:
    """The source's prefiltered documents with every non-survivor of a duplicate cluster dropped."""
    source, lake = context.partition_key, pipeline.lake
    settings = deduplicated_settings(pipeline.config, source)
    # A shard is redone when its own cluster rows change (whichever source was backfilled), so a new
    # shard leaves the other shards' files, and what reads them downstream, alone.
    versions = _shard_versions(lake, source)
    inputs = []
    for shard in upstream_inputs(lake, "prefiltered", source):
        clusters = versions.get(shard.key, EMPTY_VERSION)
        inputs.append(dataclasses.replace(shard, fingerprint=f"{shard.fingerprint} {clusters}"))
    spec = StageSpec(
        outputs=("deduplicated",),
        make_work=functools.partial(DedupWork, versions),
        params=f"{work_digest(settings)} shard cluster versions",
    )
    run = ray.run_stage(context, spec, lake, source, inputs)
    version = _built_from(lake, source)
    context.log.info(f"deduplicated[{source}] built from cluster version {version}")
    return decision_result(
        context, pipeline, run, "prefiltered", settings.checks, {CLUSTER_VERSION: version}, DUPLICATE_SHARE
    )


def _shard_versions(lake: Lake, source: str) -> dict[str, str]:
    """Shard key -> the version of its cluster file, as the clustering recorded them; files it did not
    record (a lake clustered before it did) read by tasks."""
    files = lake.files_matching(lake.dataset_dir(CLUSTERS_STAGE), f"{source}.*.parquet")
    names = [posixpath.basename(path) for path in files]
    recorded = recorded_versions(lake) or {}
    unrecorded = [(name, path) for name, path in zip(names, files, strict=True) if name not in recorded]
    read = map_tasks(functools.partial(file_cluster_version, lake.url), [path for _, path in unrecorded])
    versions = recorded | dict(zip([name for name, _ in unrecorded], read, strict=True))
    return {name.removeprefix(f"{source}.").removesuffix(".parquet"): versions[name] for name in names}


def _built_from(lake: Lake, source: str) -> str:
    if not lake.has_table("deduplicated", source):
        return EMPTY_VERSION
    # Each file's distinct versions, found by a task: the partition's rows never come into this process.
    per_file = map_tasks(
        functools.partial(file_built_from_versions, lake.url), lake.parquet_files("deduplicated", source)
    )
    versions = list(dict.fromkeys(version for versions in per_file for version in versions))
    return built_from_version(pa.table({CLUSTER_VERSION: pa.array(versions, pa.string())}))


@dg.asset_check(asset="deduplicated", blocking=True)
def built_from_current_clusters(
    context: dg.AssetCheckExecutionContext, pipeline: PipelineResource
) -> dg.AssetCheckResult:
    """The partition (every source, in a run without one) was built from the current clusters' version."""
    sources = [context.partition_key] if context.has_partition_key else pipeline.config.source_names
    current = cluster_versions(_cluster_files(pipeline.lake))
    built = {
        source: _built_from(pipeline.lake, source)
        for source in sources
        if pipeline.lake.has_table("deduplicated", source)
    }
    current_of = {s: current.get(s, EMPTY_VERSION) for s in sources}
    stale = stale_deduplicated(built, current_of)
    return problems_result(
        "built_from_current_clusters",
        stale,
        {"built_from": dg.MetadataValue.json(built), "current": dg.MetadataValue.json(current_of)},
    )


recluster = dg.define_asset_job("recluster", selection=["dedup_clusters"])
rededuplicate_source = dg.define_asset_job("rededuplicate_source", selection=["deduplicated"])


@dg.sensor(
    jobs=[recluster, rededuplicate_source],
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def dedup_consistency(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    """Re-cluster after signatures change; then rebuild each deduplicated partition whose version changed."""
    clusters = _latest(context.instance, "dedup_clusters")
    if clusters is None:
        return dg.SkipReason("dedup_clusters has not been materialised yet")
    signatures = _latest(context.instance, "minhash_signatures")
    if signatures is not None and signatures.storage_id > clusters.storage_id:
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(run_key=f"recluster-after-{signatures.storage_id}", job_name=recluster.name)
            ]
        )
    requests = []
    for source, version in sorted(clusters.asset_materialization.metadata[VERSIONS].value.items()):
        built = _latest(context.instance, "deduplicated", source)
        built_from = built and built.asset_materialization.metadata.get(CLUSTER_VERSION)
        if built is not None and getattr(built_from, "value", None) != version:
            requests.append(
                dg.RunRequest(
                    run_key=f"deduplicated-{source}-{version}",
                    job_name=rededuplicate_source.name,
                    partition_key=source,
                )
            )
    return dg.SensorResult(run_requests=requests)


def _signature_files(lake: Lake, sources: list[str]) -> list[str]:
    """Globs over the signature files of each configured source: all the global step reads."""
    missing = [s for s in sources if not lake.has_table("minhash_signatures", s)]
    if missing:
        raise FileNotFoundError(f"dedup_clusters needs minhash_signatures for sources {missing} first")
    every_source = lake.glob_pattern("minhash_signatures", partitioned=True)  # <stage>/source=*/*.parquet
    return [every_source.replace("/source=*/", f"/source={source}/") for source in sources]


def _latest(
    instance: dg.DagsterInstance, asset: str, partition: str | None = None
) -> dg.EventLogRecord | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None
        ),
        limit=1,
    ).records
    return records[0] if records else None


def _latest_metadata(instance: dg.DagsterInstance, asset: str) -> dict:
    record = _latest(instance, asset)
    return dict(record.asset_materialization.metadata) if record is not None else {}


def _report_metadata(report: DuplicateReport) -> dict:
    sizes = report.cluster_sizes
    by_source = report.by_source
    sources = list(by_source)
    columns = ["documents", "exact", "near", "within_source", "across_sources"]
    rows = "\n".join(
        f"| {s} | " + " | ".join(str(r[c]) for c in columns) + " |" for s, r in by_source.items()
    )
    across = "\n".join(f"| {d} | {s} | {n} |" for (d, s), n in report.across.items())
    return {
        "cluster_sizes": dg.MetadataValue.json({str(k): v for k, v in sizes.items()}),
        "cluster_size_histogram": dg.MetadataValue.md(
            png_markdown(
                bars_png(
                    [str(k) for k in sizes], {"clusters": list(sizes.values())}, "clusters", "cluster sizes"
                ),
                "cluster sizes",
            )
        ),
        "duplicates_by_source": dg.MetadataValue.md(
            "| source | documents | exact | near | survivor in same source | survivor in another |\n"
            "| --- | --- | --- | --- | --- | --- |\n" + rows
        ),
        "duplicates_by_source_plot": dg.MetadataValue.md(
            png_markdown(
                bars_png(
                    sources,
                    {
                        "survivor in same source": [by_source[s]["within_source"] for s in sources],
                        "survivor in another": [by_source[s]["across_sources"] for s in sources],
                    },
                    "duplicates",
                    "duplicates per source",
                ),
                "duplicates per source",
            )
        ),
        "duplicates_across_sources": dg.MetadataValue.md(
            "| duplicate in | survivor in | documents |\n| --- | --- | --- |\n" + (across or "| - | - | 0 |")
        ),
    }
