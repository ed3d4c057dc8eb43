"""Oracle labelling: rubrics, the oracles that score documents on them, and the sample they label."""

from moe_dag.data.oracle.base import (
    LABEL_SCHEMA,
    LabelRequest,
    Oracle,
    OracleError,
    OracleLabel,
    labels_to_table,
    make_label,
    requests_from_table,
    table_to_labels,
)
from moe_dag.data.oracle.openai_compatible import OpenAICompatibleConfig, OpenAICompatibleOracle
from moe_dag.data.oracle.rubrics import CODE, GENERAL, PROMPT_VERSION, Rubric, rubric_by_name, rubric_for_kind
from moe_dag.data.oracle.rules import RuleBasedOracle
from moe_dag.data.oracle.sample import stratified_sample
from moe_dag.data.oracle.vllm_engine import VLLMEngineConfig, VLLMEngineOracle

__all__ = [
    "CODE",
    "GENERAL",
    "LABEL_SCHEMA",
    "PROMPT_VERSION",
    "LabelRequest",
    "OpenAICompatibleConfig",
    "OpenAICompatibleOracle",
    "Oracle",
    "OracleError",
    "OracleLabel",
    "Rubric",
    "RuleBasedOracle",
    "VLLMEngineConfig",
    "VLLMEngineOracle",
    "labels_to_table",
    "make_label",
    "requests_from_table",
    "rubric_by_name",
    "rubric_for_kind",
    "stratified_sample",
    "table_to_labels",
]
