"""oracle_sample and oracle_labels: per source, documents to label and documents to calibrate on; labels."""

import time

import dagster as dg
import pyarrow as pa

from moe_dag.assets.operating import operated
from moe_dag.assets.reporting import problems_result
from moe_dag.assets.resources import PipelineResource
from moe_dag.operations.bounds import oracle_failure_violation
from moe_dag.operations.refresh import Refresh
from moe_dag.quality.heads import calibration_sample_size
from moe_dag.quality.oracle import LabelCache, label_documents, requests_from_table, sample_slice
from moe_dag.settings.quality import oracle_label_settings, oracle_sample_settings

FAILURE_RATE = "failure_rate_within_bound"


@dg.asset(
    group_name="quality",
    kinds={"parquet"},
    deps=["toxicity_filtered"],
    metadata=operated(
        1,
        oracle_sample_settings,
        refresh=Refresh(population="toxicity_filtered", threshold="relabel_after_change"),
    ),
)
def oracle_sample(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Documents to label and, disjoint from them, documents to calibrate thresholds on, per source.

    Both are stratified by length and drawn where the data is (`sample_slice`). The calibration sample
    is sized from the configured keep-rate precision (`calibration` in the config), each source on its
    own.
    """
    settings, lake = oracle_sample_settings(pipeline.config), pipeline.lake
    to_label, to_calibrate, counts = [], [], {}
    for source, keep_rate in settings.keep_rates.items():
        # The language (where language ID ran) travels along: thresholds are calibrated per language.
        language = ["language"] if settings.language_id[source] else []
        columns = ["id", "text", "source", *language]
        needed = calibration_sample_size(keep_rate, settings.calibration)
        # Drawn by Ray tasks per file: only the drawn documents come into this process.
        labelled, calibration = sample_slice(
            lake,
            "toxicity_filtered",
            source,
            columns,
            settings.per_source,
            needed,
            settings.seed,
        )
        to_label.append(labelled)
        to_calibrate.append(calibration)
        counts[source] = {
            "labelled": labelled.num_rows,
            "calibration": calibration.num_rows,
            "needed": needed,
        }
    # A source without language ID has no language column: its rows get a null language.
    sample = pa.concat_tables(to_label, promote_options="permissive")
    lake.write_table(sample, "oracle_sample")
    lake.write_table(pa.concat_tables(to_calibrate, promote_options="permissive"), "calibration_sample")
    return dg.MaterializeResult(
        metadata={
            "documents": sample.num_rows,
            "per_source": dg.MetadataValue.json(counts),
            "dagster/row_count": sample.num_rows,
        }
    )


@dg.asset(
    group_name="quality",
    kinds={"parquet"},
    deps=["oracle_sample"],
    metadata=operated(1, oracle_label_settings),
    pool="gpu",
    # A server that is down or overloaded: try the whole stage again after 10, 20, 40 s (the label cache
    # keeps what earlier tries paid for). Single requests are retried inside `label_documents`.
    retry_policy=dg.RetryPolicy(
        max_retries=3, delay=10, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
    ),
    check_specs=[
        dg.AssetCheckSpec(
            FAILURE_RATE,
            asset="oracle_labels",
            blocking=True,
            description="the share of sampled documents left unlabelled is within oracle.max_failure_rate",
        )
    ],
)
def oracle_labels(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Rubric scores from the oracle LLM (or the CPU rubric oracle), through the label cache.

    Labels already in the cache (same text, rubric, prompt version and model) are not paid for again;
    new ones are committed to the cache in batches as they arrive, so a killed run resumes. Documents
    the oracle could not label go to `oracle_label_failures` with their error and raw replies.
    """
    settings, lake = oracle_label_settings(pipeline.config), pipeline.lake
    requests = requests_from_table(lake.read_table("oracle_sample"), settings.kinds)
    oracle = pipeline.oracle(settings)
    started = time.perf_counter()
    report = label_documents(requests, oracle, LabelCache(lake), settings.labelling)
    seconds = time.perf_counter() - started
    lake.write_table(report.labels, "oracle_labels")
    lake.write_table(report.failures, "oracle_label_failures")
    context.log.info(
        f"{oracle.model_name}: {report.from_cache} labels from the cache, {report.newly_labelled} new, "
        f"{report.failures.num_rows} documents failed, in {seconds:.1f}s"
    )
    if report.failures.num_rows:
        context.log.warning(f"first labelling failure: {report.failures['error'][0].as_py()}")
    mean_quality = pa.TableGroupBy(report.labels, "source").aggregate([("quality", "mean")]).to_pylist()
    bound = settings.max_failure_rate
    return dg.MaterializeResult(
        metadata={
            "oracle": oracle.model_name,
            "labels": report.labels.num_rows,
            "from_cache": report.from_cache,
            "newly_labelled": report.newly_labelled,
            "failed": report.failures.num_rows,
            "failure_rate": round(report.failure_rate, 4),
            "mean_quality_per_source": dg.MetadataValue.json(
                {row["source"]: round(row["quality_mean"], 3) for row in mean_quality}
            ),
            "seconds": round(seconds, 2),
            "dagster/row_count": report.labels.num_rows,
        },
        check_results=[
            problems_result(
                FAILURE_RATE,
                [problem]
                if (problem := oracle_failure_violation(report.failures.num_rows, report.requested, bound))
                else [],
                {"failure_rate": round(report.failure_rate, 4), "bound": bound},
            )
        ],
    )
