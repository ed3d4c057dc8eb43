"""An oracle running vLLM as an offline batch engine in this process, for a GPU box with no server.

vLLM is an optional dependency (the `gpu` extra); it is imported when the oracle is built, so a missing
install fails at set-up with the command that fixes it, never halfway through a run.

Requests are cut into batches of `batch_size`; each batch goes to `LLM.chat` in one call with one
`SamplingParams` per conversation, so the engine schedules the whole batch with continuous batching,
and the batch's results are yielded before the next one starts, so the caller commits them to the label
cache as they come. Decoding is constrained to the rubric's JSON schema: `StructuredOutputsParams(json=)`
in current vLLM (>= 0.10.2), `GuidedDecodingParams(json=)` in older releases (removed in 0.12). A reply
that does not validate is retried in the next round of the same batch, exactly as the HTTP oracle
retries it: a new seed, a temperature of at least `retry_temperature`, a reminder of the schema.

One engine serves the GPUs given by `tensor_parallel_size`; to run one engine per GPU across a cluster,
hold one oracle per GPU in a Ray actor pool and hand each actor its share of the requests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from moe_dag.quality.oracle.base import LabelRequest, LabelResult, make_label, sampling_for_attempt
from moe_dag.quality.oracle.rubrics import rubric_by_name

_INSTALL_HINT = "vLLM is not installed: pip install 'moe-dag[gpu]'"


@dataclass(kw_only=True)
class VLLMEngineConfig:
    model: str = "openai/gpt-oss-120b"
    tensor_parallel_size: int = 1
    max_model_len: int = 16_384
    gpu_memory_utilization: float = 0.9
    temperature: float = 0.0
    retry_temperature: float = 0.7
    seed: int = 0
    max_tokens: int = 2048
    max_document_chars: int = 12_000
    # A reply that does not validate is asked again up to this many times in all.
    max_attempts: int = 3
    # Conversations per LLM.chat call: large enough to keep the engine's batches full, small enough
    # that a killed run loses little.
    batch_size: int = 1024
    # Passed to vllm.LLM unchanged (e.g. quantization, a reasoning parser for structured outputs).
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.batch_size < 1:
            raise ValueError(
                f"max_attempts and batch_size must be >= 1, got {self.max_attempts}, {self.batch_size}"
            )


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
        self._vllm = _import_vllm()
        self.config = config
        self.model_name = config.model
        self._llm = self._vllm.LLM(
            model=config.model,
            tensor_parallel_size=config.tensor_parallel_size,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            **config.engine_kwargs,
        )

    def label(self, requests: Sequence[LabelRequest]) -> Iterator[LabelResult]:
        for start in range(0, len(requests), self.config.batch_size):
            yield from self._label_batch(list(requests[start : start + self.config.batch_size]))

    def _label_batch(self, requests: list[LabelRequest]) -> list[LabelResult]:
        config = self.config
        results: list[LabelResult] = []
        replies: dict[str, list[str]] = {r.id: [] for r in requests}
        rejected: dict[str, str] = {}
        pending = requests
        for attempt in range(config.max_attempts):
            conversations, params = [], []
            for request in pending:
                rubric = rubric_by_name(request.rubric)
                text = request.text[: config.max_document_chars]
                conversations.append(rubric.prompt(text, rejected.get(request.id)))
                params.append(
                    self._vllm.SamplingParams(
                        max_tokens=config.max_tokens,
                        **sampling_for_attempt(
                            config.temperature, config.retry_temperature, config.seed, attempt
                        ),
                        **_json_constraint(rubric.json_schema()),
                    )
                )
            outputs = self._llm.chat(conversations, sampling_params=params, use_tqdm=False)
            still_pending = []
            for request, output in zip(pending, outputs, strict=True):
                reply = output.outputs[0].text if output.outputs else ""
                try:
                    scores = rubric_by_name(request.rubric).parse_reply(reply)
                    results.append(
                        LabelResult(
                            request, make_label(request, scores, self.model_name), attempts=attempt + 1
                        )
                    )
                except ValueError as err:
                    replies[request.id].append(reply[:2000])
                    rejected[request.id] = str(err)
                    still_pending.append(request)
            pending = still_pending
            if not pending:
                break
        results += [
            LabelResult(
                request,
                error=f"no valid label after {config.max_attempts} attempts; last: {rejected[request.id]}",
                replies=tuple(replies[request.id]),
                attempts=config.max_attempts,
            )
            for request in pending
        ]
        return results
