"""An oracle running the vLLM engine in this process, for a GPU box with no server to talk to.

vLLM is an optional dependency (the `gpu` extra); it is imported when the oracle is built, so a missing
install fails at set-up with the command that fixes it, never halfway through a run.

Decoding is constrained to the rubric's JSON schema: `StructuredOutputsParams(json=...)` in current vLLM
(>= 0.10.2), `GuidedDecodingParams(json=...)` in older releases (the field was removed in 0.12). All
requests of one rubric go to `LLM.chat` as one batch so the engine can schedule them together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from moe_dag.data.oracle.base import LabelRequest, OracleError, OracleLabel, make_label
from moe_dag.data.oracle.rubrics import Rubric, rubric_by_name

_INSTALL_HINT = "vLLM is not installed: pip install 'moe-dag[gpu]'"


@dataclass(kw_only=True)
class VLLMEngineConfig:
    model: str = "openai/gpt-oss-120b"
    tensor_parallel_size: int = 1
    max_model_len: int = 16_384
    gpu_memory_utilization: float = 0.9
    temperature: float = 0.0
    max_tokens: int = 2048
    max_document_chars: int = 12_000
    # Documents whose reply does not validate are asked again (with a new seed) up to this many times.
    max_attempts: int = 3
    # Passed to vllm.LLM unchanged (e.g. quantization, a reasoning parser for structured outputs).
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err
    return vllm


def _json_constraint(schema: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain decoding to `schema` in this vLLM version."""
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(json=schema)}
    return {"structured_outputs": StructuredOutputsParams(json=schema)}


class VLLMEngineOracle:
    def __init__(self, config: VLLMEngineConfig):
        vllm = _import_vllm()
        self.config = config
        self.model_name = config.model
        self._llm = vllm.LLM(
            model=config.model,
            tensor_parallel_size=config.tensor_parallel_size,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            **config.engine_kwargs,
        )

    def label(self, requests: Sequence[LabelRequest]) -> list[OracleLabel]:
        labels: dict[str, OracleLabel] = {}
        for rubric_name in sorted({r.rubric for r in requests}):
            batch = [r for r in requests if r.rubric == rubric_name]
            labels.update(self._label_rubric(rubric_by_name(rubric_name), batch))
        return [labels[r.id] for r in requests]

    def _label_rubric(self, rubric: Rubric, requests: list[LabelRequest]) -> dict[str, OracleLabel]:
        from vllm import SamplingParams

        labels: dict[str, OracleLabel] = {}
        errors: dict[str, str] = {}
        pending = list(requests)
        for attempt in range(self.config.max_attempts):
            params = SamplingParams(
                temperature=self.config.temperature,
                max_tokens=self.config.max_tokens,
                seed=attempt,
                **_json_constraint(rubric.json_schema()),
            )
            conversations = [rubric.prompt(r.text[: self.config.max_document_chars]) for r in pending]
            outputs = self._llm.chat(conversations, params, use_tqdm=True)
            failed = []
            for request, output in zip(pending, outputs, strict=True):
                try:
                    scores = rubric.parse_reply(output.outputs[0].text)
                    labels[request.id] = make_label(request, scores, self.model_name)
                except ValueError as err:
                    errors[request.id] = str(err)
                    failed.append(request)
            pending = failed
            if not pending:
                return labels
        first = pending[0].id
        raise OracleError(
            f"{len(pending)} documents got no valid label after {self.config.max_attempts} attempts, "
            f"first {first!r}: {errors[first]}"
        )
