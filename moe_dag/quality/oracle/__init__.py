"""Oracle labelling: rubrics, the oracles that score documents on them, the label cache and the sample."""

from moe_dag.quality.oracle.base import (
    FAILURE_SCHEMA,
    LABEL_SCHEMA,
    LabelRequest,
    LabelResult,
    Oracle,
    OracleError,
    OracleLabel,
    failures_to_table,
    labels_to_table,
    make_label,
    requests_from_table,
    table_to_labels,
)
from moe_dag.quality.oracle.cache import CACHE_STAGE, LabelCache, text_hash
from moe_dag.quality.oracle.labelling import LabellingConfig, LabellingReport, label_documents
from moe_dag.quality.oracle.openai_compatible import OpenAICompatibleConfig, OpenAICompatibleOracle
from moe_dag.quality.oracle.redact import redact
from moe_dag.quality.oracle.rubrics import (
    CODE,
    GENERAL,
    PROMPT_VERSION,
    Rubric,
    rubric_by_name,
    rubric_for_kind,
)
from moe_dag.quality.oracle.rules import RuleBasedOracle
from moe_dag.quality.oracle.sample import sample_slice, split_sample, stratified_sample
from moe_dag.quality.oracle.vllm_engine import VLLMEngineConfig, VLLMEngineOracle

__all__ = [
    "CACHE_STAGE",
    "CODE",
    "FAILURE_SCHEMA",
    "GENERAL",
    "LABEL_SCHEMA",
    "PROMPT_VERSION",
    "LabelCache",
    "LabelRequest",
    "LabelResult",
    "LabellingConfig",
    "LabellingReport",
    "OpenAICompatibleConfig",
    "OpenAICompatibleOracle",
    "Oracle",
    "OracleError",
    "OracleLabel",
    "Rubric",
    "RuleBasedOracle",
    "VLLMEngineConfig",
    "VLLMEngineOracle",
    "failures_to_table",
    "label_documents",
    "labels_to_table",
    "make_label",
    "redact",
    "requests_from_table",
    "rubric_by_name",
    "rubric_for_kind",
    "sample_slice",
    "split_sample",
    "stratified_sample",
    "table_to_labels",
    "text_hash",
]
