"""The in-process vLLM batch oracle, driven through a test double with vLLM's offline interface.

The double stands in for `vllm.LLM`, `vllm.SamplingParams` and
`vllm.sampling_params.StructuredOutputsParams` as vLLM >= 0.10.2 defines them: `LLM.chat` takes a
list of conversations and one SamplingParams per conversation and returns one RequestOutput each,
whose `.outputs[0].text` is the generated text. With vLLM installed and MOE_DAG_VLLM_MODEL naming a
local model, the last test runs the real engine instead.
"""

from __future__ import annotations

import json
import os
import sys
import types
from dataclasses import dataclass

import pytest

from moe_dag.quality.oracle import (
    CODE,
    GENERAL,
    LabelCache,
    LabellingConfig,
    LabelRequest,
    VLLMEngineConfig,
    VLLMEngineOracle,
    label_documents,
)
from moe_dag.storage.lake import Lake

SCORES = {"helpfulness": 3, "correctness": 4, "coherence": 4, "complexity": 2, "verbosity": 2}
CODE_SCORES = {"readability": 7, "modularity": 6, "clarity": 5, "reusability": 4}


@dataclass
class StructuredOutputsParams:
    json: dict | None = None


@dataclass(kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int | None = 16
    seed: int | None = None
    structured_outputs: StructuredOutputsParams | None = None


@dataclass
class CompletionOutput:
    text: str


@dataclass
class RequestOutput:
    outputs: list[CompletionOutput]


class FakeLLM:
    """vllm.LLM's constructor and chat(); answers by document text (see `_reply`)."""

    instances: list[FakeLLM] = []

    def __init__(self, model: str, **kwargs):
        self.model, self.kwargs = model, kwargs
        self.calls: list[list[tuple[list[dict], SamplingParams]]] = []
        FakeLLM.instances.append(self)

    def chat(self, messages, sampling_params=None, use_tqdm=True, **kwargs):
        assert isinstance(messages[0], list) and len(sampling_params) == len(messages)
        self.calls.append(list(zip(messages, sampling_params, strict=True)))
        return [
            RequestOutput([CompletionOutput(_reply(m, p))])
            for m, p in zip(messages, sampling_params, strict=True)
        ]


def _reply(conversation: list[dict], params: SamplingParams) -> str:
    text = conversation[1]["content"].split("<document>\n", 1)[1].split("\n</document>", 1)[0]
    if text == "stubborn":
        return "analysis: hmm, not sure"
    if text == "flaky" and params.seed == 0:
        return json.dumps(SCORES | {"coherence": 11})
    if params.structured_outputs.json == CODE.json_schema():
        return "thinking... " + json.dumps(CODE_SCORES)
    return json.dumps(SCORES)


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    sampling_params = types.ModuleType("vllm.sampling_params")
    vllm.LLM, vllm.SamplingParams, vllm.sampling_params = FakeLLM, SamplingParams, sampling_params
    sampling_params.SamplingParams = SamplingParams
    sampling_params.StructuredOutputsParams = StructuredOutputsParams
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling_params)
    FakeLLM.instances.clear()
    return vllm


def _requests(texts: list[str], rubric: str = "general") -> list[LabelRequest]:
    return [LabelRequest(id=f"{rubric}-{t}", text=t, source="s", rubric=rubric) for t in texts]


def test_engine_batches_constrains_decoding_and_retries_with_new_sampling(fake_vllm):
    config = VLLMEngineConfig(model="local/gpt-oss", batch_size=3, engine_kwargs={"quantization": "mxfp4"})
    oracle = VLLMEngineOracle(config)
    [llm] = FakeLLM.instances
    assert llm.model == "local/gpt-oss" and llm.kwargs["quantization"] == "mxfp4"
    requests = _requests(["a", "flaky", "stubborn", "b"]) + _requests(["def f(): pass"], "code")
    results = oracle.label(requests)

    first_batch = [next(results) for _ in range(3)]  # results come batch by batch, not at the end
    assert len(llm.calls) == 3  # batch one: first attempt, then a retry round for each failure left
    assert {r.request.id for r in first_batch} == {"general-a", "general-flaky", "general-stubborn"}
    rest = list(results)
    by_id = {r.request.id: r for r in first_batch + rest}
    assert len(by_id) == 5

    assert by_id["general-a"].label.scores == SCORES and by_id["general-a"].attempts == 1
    assert by_id["general-flaky"].label.scores == SCORES and by_id["general-flaky"].attempts == 2
    assert by_id["code-def f(): pass"].label.scores == CODE_SCORES
    stubborn = by_id["general-stubborn"]
    assert stubborn.label is None and stubborn.attempts == 3 and "not JSON" in stubborn.error
    assert stubborn.replies == ("analysis: hmm, not sure",) * 3

    first, retry = llm.calls[0], llm.calls[1]
    assert [p.seed for _, p in first] == [0, 0, 0] and [p.temperature for _, p in first] == [0.0] * 3
    assert [p.seed for _, p in retry] == [1, 1] and all(p.temperature == 0.7 for _, p in retry)
    assert first[0][1].structured_outputs.json == GENERAL.json_schema()
    assert "rejected" in retry[0][0][1]["content"] and "rejected" not in first[1][0][1]["content"]
    code_call = next(pair for call in llm.calls for pair in call if "def f()" in pair[0][1]["content"])
    assert code_call[1].structured_outputs.json == CODE.json_schema()


def test_engine_shares_the_label_cache_with_every_backend(fake_vllm, tmp_path):
    cache = LabelCache(Lake(tmp_path))
    oracle = VLLMEngineOracle(VLLMEngineConfig(model="local/gpt-oss", batch_size=2))
    requests = _requests(["a", "b", "c", "stubborn"])
    first = label_documents(requests, oracle, cache, LabellingConfig(commit_every=2))
    assert first.labels.num_rows == 3 and first.failures.num_rows == 1
    asked = sum(len(call) for call in FakeLLM.instances[0].calls)
    second = label_documents(requests, oracle, cache, LabellingConfig())
    assert second.from_cache == 3 and second.labels.num_rows == 3
    asked_again = sum(len(call) for call in FakeLLM.instances[0].calls) - asked
    assert asked_again == 3  # only the failed document, asked three times


def test_engine_reports_a_missing_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(ImportError, match=r"vLLM is not installed: pip install 'moe-dag\[gpu\]'"):
        VLLMEngineOracle(VLLMEngineConfig())


@pytest.mark.skipif(
    "MOE_DAG_VLLM_MODEL" not in os.environ, reason="set MOE_DAG_VLLM_MODEL to a local model to run real vLLM"
)
def test_real_engine_labels_documents():  # pragma: no cover - needs a GPU, vLLM and a local model
    pytest.importorskip("vllm")
    oracle = VLLMEngineOracle(VLLMEngineConfig(model=os.environ["MOE_DAG_VLLM_MODEL"], max_model_len=4096))
    results = list(oracle.label(_requests(["Water boils at 100 degrees Celsius at sea level."])))
    assert len(results) == 1 and (results[0].label is not None or results[0].replies)
