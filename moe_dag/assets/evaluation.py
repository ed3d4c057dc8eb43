"""neutral_documents and evaluation_sets: the evaluation sets fixed before any filter runs.

`neutral_documents` draws each source's neutral sample from its raw documents by id hash and lists what
training must never see (the sample, its exact copies, its dedup cluster mates); the tokenizer, the
curated mixture, the unfiltered baseline and the mixture search all leave those out. `evaluation_sets`
tokenises the neutral set and the config's user sets, one folder each, for the trainer's `--eval-on`,
and lists their documents for the catalog (`evaluation_documents`). See moe_dag/mixture/neutral.py.

A new shard adds its own neutral documents (membership is per id) and so a new `neutral_documents`;
`evaluation_sets` follows it, as the mixture does, only when the mixture's refresh policy says the
sources moved enough (`refresh.remix_after_change`): the mixture, the evaluation sets and the proxy
scored on them then change together, and a small shard costs no re-evaluation.
"""

from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from moe_dag.assets.mixture import REMIX, TOKENIZER_FILE
from moe_dag.assets.operating import operated
from moe_dag.assets.resources import PipelineResource, RayResource
from moe_dag.mixture.neutral import (
    NEUTRAL_SET,
    NEUTRAL_STAGE,
    EvaluationConfig,
    read_user_set,
    select_neutral_in_tasks,
    write_evaluation_set,
    write_exclusions,
)
from moe_dag.mixture.tokenizer import eos_id, load_tokenizer
from moe_dag.settings.training import evaluation_set_settings, neutral_settings
from moe_dag.storage.lake import Lake

SET_DOCUMENTS_STAGE = "evaluation_documents"


def evaluation_set_dirs(lake: Lake, evaluation: EvaluationConfig) -> dict[str, Path]:
    """Set name -> its tokenised folder (neutral first), as `evaluation_sets` wrote them."""
    root = lake.artifact_dir("evaluation_sets")
    names = ([NEUTRAL_SET] if evaluation.neutral_share else []) + sorted(evaluation.user_sets)
    return {name: root / name for name in names}


@dg.asset(
    group_name="training",
    kinds={"parquet"},
    deps=["raw_documents", "dedup_clusters"],
    metadata=operated(2, neutral_settings),
)
def neutral_documents(pipeline: PipelineResource, ray: RayResource) -> dg.MaterializeResult:
    """Each source's neutral evaluation sample, drawn from the raw documents by id hash before any filter
    decides, and every document training must leave out because of it (the sample, exact copies, dedup
    cluster mates). The raw files are read in Ray tasks (`ray` connects this run to the cluster)."""
    del ray  # required for its connection: the library's tasks run wherever this process is connected
    lake, settings = pipeline.lake, neutral_settings(pipeline.config)
    clusters = (
        lake.glob_pattern("dedup_clusters", partitioned=False) if lake.has_table("dedup_clusters") else None
    )
    # The raw text is read in tasks, which write the documents; ids and hashes come back here.
    selected = select_neutral_in_tasks(
        lake, settings.sources, settings.neutral_share, clusters, NEUTRAL_STAGE
    )
    write_exclusions(lake, selected.exclusions, selected.digest)
    reasons = pc.value_counts(selected.exclusions["reason"]).to_pylist()
    # The set's content, not the clusters' rebuild, decides whether the evaluation sets and what trains
    # are stale: a new shard that changes neither the sample nor what it excludes leaves them as they are.
    return dg.MaterializeResult(
        metadata={
            "documents": sum(selected.per_source.values()),
            "per_source": dg.MetadataValue.json(selected.per_source),
            "excluded_from_training": dg.MetadataValue.json({r["values"]: r["counts"] for r in reasons}),
        },
        data_version=dg.DataVersion(selected.digest),
    )


@dg.asset(
    group_name="training",
    kinds={"parquet"},
    deps=["tokenizer", "neutral_documents"],
    metadata=operated(1, evaluation_set_settings, refresh=REMIX),
)
def evaluation_sets(pipeline: PipelineResource) -> dg.MaterializeResult:
    """The neutral set and each user set tokenised in the layout `--eval-on` reads, one folder each."""
    lake, settings = pipeline.lake, evaluation_set_settings(pipeline.config)
    tokenizer = load_tokenizer(lake.artifact_dir("tokenizer") / TOKENIZER_FILE)
    eos = eos_id(tokenizer, settings.eos_token)
    listed = []
    for name, folder in evaluation_set_dirs(lake, settings.evaluation).items():
        documents = (
            lake.read_table(NEUTRAL_STAGE)
            if name == NEUTRAL_SET
            else read_user_set(name, settings.evaluation.user_sets[name])
        )
        table = write_evaluation_set(documents, tokenizer, eos, settings.seq_len, folder)
        listed.append(
            pa.table(
                {
                    "eval_set": [name] * table.num_rows,
                    "source": table["source"],
                    "id": table["id"],
                    "tokens": pc.list_value_length(table["tokens"]),
                    "num_bytes": table["num_bytes"],
                }
            )
        )
    if listed:
        lake.write_table(pa.concat_tables(listed), SET_DOCUMENTS_STAGE)
    lake.publish_artifact("evaluation_sets")
    return dg.MaterializeResult(
        metadata={
            "sets": dg.MetadataValue.json(
                {t["eval_set"][0].as_py(): _counts(t["source"]) for t in listed if t.num_rows}
            ),
            "path": dg.MetadataValue.path(str(lake.artifact_dir("evaluation_sets"))),
        }
    )


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    return {row["values"]: row["counts"] for row in pc.value_counts(column).to_pylist()}
