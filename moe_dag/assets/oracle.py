"""oracle_sample and oracle_labels: a stratified sample of the filtered documents, labelled on rubrics."""

import time

import dagster as dg
import pyarrow as pa

from moe_dag.data.oracle import LabelRequest, labels_to_table, rubric_for_kind, stratified_sample
from moe_dag.data.schema import kept_rows
from moe_dag.resources import PipelineResource


@dg.asset(group_name="quality", kinds={"parquet"}, deps=["toxicity_filtered"])
def oracle_sample(pipeline: PipelineResource) -> dg.MaterializeResult:
    """Documents to label, stratified by source and length so each source's heads see its range."""
    config = pipeline.config
    # Sources carry different score columns (code has no language ID), so keep the common ones.
    documents = pa.concat_tables(
        [
            kept_rows(pipeline.lake.read_table("toxicity_filtered", name)).select(["id", "text", "source"])
            for name in config.source_names
        ]
    )
    sample = stratified_sample(documents, per_source=config.oracle.per_source, seed=config.oracle.seed)
    pipeline.lake.write_table(sample, "oracle_sample")
    per_source = pa.compute.value_counts(sample["source"]).to_pylist()
    return dg.MaterializeResult(
        metadata={
            "documents": sample.num_rows,
            "per_source": dg.MetadataValue.json({c["values"]: c["counts"] for c in per_source}),
            "dagster/row_count": sample.num_rows,
        }
    )


@dg.asset(group_name="quality", kinds={"parquet"}, deps=["oracle_sample"], pool="gpu")
def oracle_labels(context: dg.AssetExecutionContext, pipeline: PipelineResource) -> dg.MaterializeResult:
    """Rubric scores from the oracle LLM (or the CPU rubric oracle), one row per sampled document."""
    config = pipeline.config
    sample = pipeline.lake.read_table("oracle_sample")
    requests = [
        LabelRequest(
            id=row["id"],
            text=row["text"],
            source=row["source"],
            rubric=rubric_for_kind(config.source(row["source"]).kind).name,
        )
        for row in sample.to_pylist()
    ]
    oracle = pipeline.oracle()
    started = time.perf_counter()
    labels = labels_to_table(oracle.label(requests))
    seconds = time.perf_counter() - started
    pipeline.lake.write_table(labels, "oracle_labels")
    context.log.info(f"{oracle.model_name} labelled {labels.num_rows} documents in {seconds:.1f}s")
    mean_quality = pa.TableGroupBy(labels, "source").aggregate([("quality", "mean")]).to_pylist()
    return dg.MaterializeResult(
        metadata={
            "oracle": oracle.model_name,
            "labels": labels.num_rows,
            "mean_quality_per_source": dg.MetadataValue.json(
                {row["source"]: round(row["quality_mean"], 3) for row in mean_quality}
            ),
            "seconds": round(seconds, 2),
            "dagster/row_count": labels.num_rows,
        }
    )
