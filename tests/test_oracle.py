"""Rubrics, the rule-based and HTTP oracles, the label table and the stratified sample."""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx
import pyarrow as pa
import pytest

from moe_dag.data.oracle import (
    CODE,
    GENERAL,
    PROMPT_VERSION,
    LabelRequest,
    OpenAICompatibleConfig,
    OpenAICompatibleOracle,
    OracleError,
    RuleBasedOracle,
    VLLMEngineConfig,
    VLLMEngineOracle,
    labels_to_table,
    requests_from_table,
    rubric_for_kind,
    stratified_sample,
    table_to_labels,
)

PROSE = (
    "The mitochondrion is the organelle that produces most of the chemical energy a cell needs. "
    "It stores that energy in a small molecule called adenosine triphosphate. Mitochondria carry "
    "their own small chromosomes, which are usually inherited only from the mother. Because of this, "
    "researchers use mitochondrial DNA to trace ancestry across many generations of a population."
)
SPAM = "buy cheap pills now buy cheap pills now buy cheap pills now\n" * 6
SYMBOLS = "#$%@ !!! ~~~ ??? &&& *** ((( ))) ### $$$ @@@ !!! %%% ^^^"
GOOD_CODE = '''
def mean(values: list[float]) -> float:
    """Arithmetic mean of a non-empty list."""
    return sum(values) / len(values)


class RunningTotal:
    """Accumulates numbers one at a time."""

    def __init__(self) -> None:
        self.total = 0.0

    def add(self, value: float) -> float:
        # Return the new total so callers can chain.
        self.total += value
        return self.total
'''
BAD_CODE = "x=1\ny=2\nz=x+y\nprint(z)\nq=[i*i for i in range(10)]\nprint(q)\n" * 4


def test_rubric_kinds_and_quality():
    assert rubric_for_kind("code") is CODE
    assert rubric_for_kind("cc") is rubric_for_kind("math") is GENERAL
    assert CODE.quality(dict.fromkeys(CODE.dimensions, 10)) == 1.0
    assert CODE.quality(dict.fromkeys(CODE.dimensions, 5)) == 0.5
    best = {"helpfulness": 4, "correctness": 4, "coherence": 4, "complexity": 4, "verbosity": 2}
    assert GENERAL.quality(best) == 1.0
    # Verbosity is best in the middle: padding costs as much as terseness.
    assert GENERAL.quality(best | {"verbosity": 4}) == GENERAL.quality(best | {"verbosity": 0}) == 0.8


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ({"readability": 3, "modularity": 3, "clarity": 3}, "missing dimension 'reusability'"),
        (
            {"readability": 11, "modularity": 3, "clarity": 3, "reusability": 3},
            "'readability' = 11 is outside",
        ),
        (
            {"readability": -1, "modularity": 3, "clarity": 3, "reusability": 3},
            "'readability' = -1 is outside",
        ),
        (
            {"readability": 2.5, "modularity": 3, "clarity": 3, "reusability": 3},
            "'readability' must be an int",
        ),
        (
            {"readability": True, "modularity": 3, "clarity": 3, "reusability": 3},
            "'readability' must be an int",
        ),
        (
            {"readability": 1, "modularity": 3, "clarity": 3, "reusability": 3, "style": 3},
            "unknown dimension 'style'",
        ),
    ],
)
def test_rubric_validation_names_the_dimension(scores, message):
    with pytest.raises(ValueError, match=message):
        CODE.quality(scores)


def test_rubric_schema_prompt_and_reply_parsing():
    schema = GENERAL.json_schema()
    assert schema["required"] == list(GENERAL.dimensions)
    assert schema["properties"]["verbosity"] == {"type": "integer", "minimum": 0, "maximum": 4}
    assert schema["additionalProperties"] is False
    messages = CODE.prompt("def f(): pass")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "def f(): pass" in messages[1]["content"]
    assert all(dim in messages[0]["content"] for dim in CODE.dimensions)
    reply = (
        'Let me think {not json}. Final: {"readability": 7, "modularity": 6, "clarity": 5, "reusability": 4}'
    )
    assert CODE.parse_reply(reply) == {"readability": 7, "modularity": 6, "clarity": 5, "reusability": 4}
    with pytest.raises(ValueError, match="not JSON"):
        CODE.parse_reply("no scores here")
    with pytest.raises(ValueError, match="missing dimension 'clarity'"):
        CODE.parse_reply('{"readability": 7, "modularity": 6, "reusability": 4}')


def _request(text: str, rubric: str = "general", doc_id: str = "d") -> LabelRequest:
    return LabelRequest(id=doc_id, text=text, source="code" if rubric == "code" else "cc", rubric=rubric)


def test_rule_oracle_ranks_clean_text_above_junk_and_is_deterministic():
    oracle = RuleBasedOracle()
    prose, spam, symbols = oracle.label([_request(PROSE), _request(SPAM), _request(SYMBOLS)])
    assert prose.quality > spam.quality > symbols.quality
    assert prose.scores["correctness"] == 4 and symbols.scores["correctness"] == 0
    assert spam.scores["correctness"] < prose.scores["correctness"]
    assert oracle.label([_request(PROSE)]) == [prose]
    assert prose.model == "rules-v1" and prose.prompt_version == PROMPT_VERSION


def test_rule_oracle_ranks_structured_code_above_a_flat_script():
    good, bad = RuleBasedOracle().label([_request(GOOD_CODE, "code"), _request(BAD_CODE, "code")])
    assert set(good.scores) == set(CODE.dimensions)
    for dim in ("modularity", "clarity", "reusability"):
        assert good.scores[dim] > bad.scores[dim], dim
    assert good.quality > bad.quality + 0.3


def test_label_table_round_trip():
    docs = pa.table({"id": ["a", "b"], "text": [PROSE, GOOD_CODE], "source": ["cc", "code"]})
    requests = requests_from_table(docs)
    assert [r.rubric for r in requests] == ["general", "code"]
    labels = RuleBasedOracle().label(requests)
    table = labels_to_table(labels)
    assert table["score_readability"].to_pylist()[0] is None
    assert table["score_readability"].to_pylist()[1] == labels[1].scores["readability"]
    assert json.loads(table["scores"][0].as_py()) == labels[0].scores
    assert table_to_labels(table) == labels


def _reply(scores: dict, status: int = 200) -> httpx.Response:
    return httpx.Response(
        status, json={"choices": [{"message": {"role": "assistant", "content": json.dumps(scores)}}]}
    )


SCORES = {"helpfulness": 3, "correctness": 4, "coherence": 4, "complexity": 2, "verbosity": 2}


def _oracle(handler, **overrides) -> OpenAICompatibleOracle:
    config = OpenAICompatibleConfig(base_url="http://vllm.test/v1", backoff_s=0.0, **overrides)
    return OpenAICompatibleOracle(config, transport=httpx.MockTransport(handler))


def test_http_oracle_sends_schema_and_key(monkeypatch):
    monkeypatch.setenv("TEST_ORACLE_KEY", "secret")
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _reply(SCORES)

    [label] = _oracle(handler, api_key_env="TEST_ORACLE_KEY").label([_request(PROSE)])
    assert label.scores == SCORES and label.model == "openai/gpt-oss-120b"
    assert label.quality == GENERAL.quality(SCORES)
    request = seen[0]
    assert str(request.url) == "http://vllm.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer secret"
    body = json.loads(request.content)
    assert body["model"] == "openai/gpt-oss-120b"
    assert body["response_format"]["json_schema"]["schema"] == GENERAL.json_schema()
    assert PROSE in body["messages"][1]["content"]


def test_http_oracle_retries_after_server_error():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(500, text="overloaded") if len(calls) == 1 else _reply(SCORES)

    [label] = _oracle(handler).label([_request(PROSE)])
    assert label.scores == SCORES and len(calls) == 2


def test_http_oracle_gives_up_on_replies_that_never_validate():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        content = "not json" if len(calls) % 2 else json.dumps(SCORES | {"verbosity": 9})
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    with pytest.raises(OracleError, match=r"document 'doc-7'.*3 attempts"):
        _oracle(handler, max_retries=2).label([_request(PROSE, doc_id="doc-7")])
    assert len(calls) == 3


def test_http_oracle_does_not_retry_client_errors_and_stops_the_sample():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, text="unknown model")

    requests = [_request(PROSE, doc_id=f"d{i}") for i in range(20)]
    with pytest.raises(OracleError, match="document 'd0': HTTP 400"):
        _oracle(handler, max_concurrency=1).label(requests)
    assert len(calls) <= 2  # no retry of d0, and the queued documents were cancelled


def test_http_oracle_bounds_concurrency_and_keeps_order():
    lock, in_flight, peak = threading.Lock(), [0], [0]

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.02)
        with lock:
            in_flight[0] -= 1
        complexity = int(json.loads(request.content)["messages"][1]["content"].count("x")) % 5
        return _reply(SCORES | {"complexity": complexity})

    requests = [_request("x" * i, doc_id=f"d{i}") for i in range(12)]
    labels = _oracle(handler, max_concurrency=3).label(requests)
    assert [label.id for label in labels] == [r.id for r in requests]
    assert [label.scores["complexity"] for label in labels] == [i % 5 for i in range(12)]
    assert 2 <= peak[0] <= 3


def test_vllm_engine_reports_missing_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(ImportError, match=r"vLLM is not installed: pip install 'moe-dag\[gpu\]'"):
        VLLMEngineOracle(VLLMEngineConfig())


def _corpus() -> pa.Table:
    ids = [f"{s}-{i:03d}" for s in ("cc", "code") for i in range(100)] + ["math-0", "math-1"]
    lengths = list(range(1, 101)) * 2 + [5, 6]
    sources = ["cc"] * 100 + ["code"] * 100 + ["math"] * 2
    return pa.table({"id": ids, "text": ["w" * n for n in lengths], "source": sources})


def test_stratified_sample_covers_sources_and_lengths_deterministically():
    corpus = _corpus()
    sample = stratified_sample(corpus, per_source=8, seed=1)
    rows = sample.to_pylist()
    assert sum(r["source"] == "cc" for r in rows) == sum(r["source"] == "code" for r in rows) == 8
    assert sorted(r["id"] for r in rows if r["source"] == "math") == ["math-0", "math-1"]
    for source in ("cc", "code"):
        quartiles = sorted((len(r["text"]) - 1) // 25 for r in rows if r["source"] == source)
        assert quartiles == [0, 0, 1, 1, 2, 2, 3, 3]
    assert stratified_sample(corpus, per_source=8, seed=1).equals(sample)
    assert stratified_sample(corpus, per_source=8, seed=2)["id"].to_pylist() != sample["id"].to_pylist()
    reversed_corpus = corpus.take(list(range(corpus.num_rows - 1, -1, -1)))
    assert set(stratified_sample(reversed_corpus, per_source=8, seed=1)["id"].to_pylist()) == set(
        sample["id"].to_pylist()
    )
    with pytest.raises(ValueError, match="per_source"):
        stratified_sample(corpus, per_source=0, seed=1)
