"""The HTTP oracle against a real server on 127.0.0.1: retries, deadlines, bad replies, the key kept out.

Covers issue 6 items 11 (malformed Retry-After), 12 (total deadline per request) and 13 (the key never
in messages), and the oracle side of issue 9.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from oracle_server import OracleServer, Reply, completion, document_of, scores_reply

from moe_dag.quality.oracle import (
    GENERAL,
    LabelCache,
    LabellingConfig,
    LabelRequest,
    OpenAICompatibleConfig,
    OpenAICompatibleOracle,
    OracleError,
    label_documents,
    redact,
)
from moe_dag.quality.oracle.openai_compatible import retry_after_seconds
from moe_dag.storage.lake import Lake

SCORES = {"helpfulness": 3, "correctness": 4, "coherence": 4, "complexity": 2, "verbosity": 2}
KEY = "sk-test-0123456789abcdef"


def _requests(count: int, prefix: str = "doc") -> list[LabelRequest]:
    return [
        LabelRequest(id=f"{prefix}-{i}", text=f"{prefix} text {i}", source="web", rubric="general")
        for i in range(count)
    ]


def _oracle(server: OracleServer, **overrides) -> OpenAICompatibleOracle:
    settings = {"base_url": server.url, "backoff_s": 0.0, "api_key_env": "TEST_ORACLE_KEY"} | overrides
    return OpenAICompatibleOracle(OpenAICompatibleConfig(**settings))


def _by_id(results) -> dict:
    return {result.request.id: result for result in results}


def test_sends_the_schema_the_key_and_the_first_attempts_sampling(monkeypatch):
    monkeypatch.setenv("TEST_ORACLE_KEY", KEY)
    with OracleServer(lambda payload, headers: scores_reply(SCORES)) as server:
        [result] = list(_oracle(server).label(_requests(1)))
    assert result.label.scores == SCORES and result.label.model == "openai/gpt-oss-120b"
    assert result.attempts == 1 and result.label.quality == GENERAL.quality(SCORES)
    call = server.calls[0]
    assert call.headers["authorization"] == f"Bearer {KEY}"
    assert call.payload["response_format"]["json_schema"]["schema"] == GENERAL.json_schema()
    assert call.payload["temperature"] == 0.0 and call.payload["seed"] == 0
    assert call.document == "doc text 0"


def test_a_retry_is_never_the_request_that_failed():
    def respond(payload, headers):
        first = payload["seed"] == 0
        return scores_reply(SCORES | {"verbosity": 9}) if first else scores_reply(SCORES)

    with OracleServer(respond) as server:
        [result] = list(_oracle(server).label(_requests(1)))
    assert result.label is not None and result.attempts == 2
    first, second = (call.payload for call in server.calls)
    assert second["seed"] == first["seed"] + 1
    assert first["temperature"] == 0.0 and second["temperature"] == 0.7
    assert "rejected" not in first["messages"][1]["content"]
    assert "'verbosity' = 9 is outside" in second["messages"][1]["content"]
    assert json.dumps(GENERAL.json_schema(), sort_keys=True) in second["messages"][1]["content"]


def test_server_errors_and_429_are_retried_honouring_retry_after():
    statuses = iter([500, 503, 429])

    def respond(payload, headers):
        status = next(statuses, 200)
        if status == 429:
            return Reply(status=429, body="slow down", headers={"Retry-After": "0.3"})
        return scores_reply(SCORES) if status == 200 else Reply(status=status, body="overloaded")

    with OracleServer(respond) as server:
        started = time.monotonic()
        [result] = list(_oracle(server).label(_requests(1)))
    assert result.label is not None and result.attempts == 4
    assert time.monotonic() - started >= 0.25  # waited as the 429 asked, not the zero backoff


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "soon", "", "Wed, 21 Oct 2015 07:28:00 GMT"])
def test_a_malformed_retry_after_does_not_kill_the_batch(value):
    """Issue 6, item 11: -1 or nan made time.sleep raise and the whole batch fail."""
    calls = []

    def respond(payload, headers):
        calls.append(1)
        if len(calls) % 2:
            return Reply(status=429, body="busy", headers={"Retry-After": value})
        return scores_reply(SCORES)

    with OracleServer(respond) as server:
        results = list(_oracle(server, max_concurrency=1).label(_requests(3)))
    assert all(result.label is not None for result in results) and len(results) == 3


def test_retry_after_is_clamped_and_unparsable_values_ignored():
    assert retry_after_seconds("2.5", cap=30) == 2.5
    assert retry_after_seconds("-1", cap=30) == 0.0
    assert retry_after_seconds("1e9", cap=30) == 30
    assert retry_after_seconds("nan", cap=30) is None
    assert retry_after_seconds("inf", cap=30) is None
    assert retry_after_seconds("tomorrow", cap=30) is None
    assert retry_after_seconds(None, cap=30) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", cap=30) == 0.0  # a date in the past
    assert retry_after_seconds("Wed, 21 Oct 2099 07:28:00 GMT", cap=30) == 30


def test_a_dripping_server_cannot_hold_a_request_past_its_deadline():
    """Issue 6, item 12: one byte every 0.5 s held a request for 69 s at timeout_s=2."""
    body = json.dumps(completion(json.dumps(SCORES)))
    with OracleServer(lambda payload, headers: Reply(body=body, drip_s=0.1)) as server:
        started = time.monotonic()
        [result] = list(_oracle(server, timeout_s=1.0, max_retries=1).label(_requests(1)))
        elapsed = time.monotonic() - started
    assert result.label is None and "deadline" in result.error and result.attempts == 2
    assert elapsed < 3.5  # two attempts of one second, not the ~25 s the drip would take


def test_an_answer_past_the_timeout_is_retried():
    def respond(payload, headers):
        return Reply(body=completion(json.dumps(SCORES)), delay_s=2.0 if payload["seed"] == 0 else 0.0)

    with OracleServer(respond) as server:
        started = time.monotonic()
        [result] = list(_oracle(server, timeout_s=0.5).label(_requests(1)))
    assert result.label is not None and result.attempts == 2
    assert time.monotonic() - started < 1.8


def test_bad_replies_fail_their_document_and_nothing_is_lost():
    behaviours = {
        "malformed": lambda: Reply(body='{"choices": [{"message": '),
        "out_of_range": lambda: scores_reply(SCORES | {"correctness": 7}),
        "refusal": lambda: Reply(body=completion(None, refusal="I can't help with that.")),
        "missing": lambda: scores_reply({"helpfulness": 3}),
        "good": lambda: scores_reply(SCORES),
    }
    requests = [LabelRequest(id=name, text=name, source="web", rubric="general") for name in behaviours]
    with OracleServer(lambda payload, headers: behaviours[document_of(payload)]()) as server:
        results = _by_id(_oracle(server, max_retries=2).label(requests))
    assert set(results) == set(behaviours)
    assert results["good"].label.scores == SCORES
    for name, expected in [
        ("malformed", "malformed response body"),
        ("out_of_range", "'correctness' = 7 is outside"),
        ("refusal", "the model refused"),
        ("missing", "missing dimension"),
    ]:
        failed = results[name]
        assert failed.label is None and failed.attempts == 3, name
        assert expected in failed.error, (name, failed.error)
        assert len(failed.replies) == 3  # the raw replies are kept for inspection
    assert sum(call.document == "good" for call in server.calls) == 1


def test_client_errors_fail_the_document_but_auth_errors_stop_the_run():
    def respond(payload, headers):
        if document_of(payload) == "too long":
            return Reply(status=400, body='{"error": "maximum context length exceeded"}')
        return scores_reply(SCORES)

    requests = [LabelRequest(id=t, text=t, source="web", rubric="general") for t in ("too long", "fine")]
    with OracleServer(respond) as server:
        results = _by_id(_oracle(server).label(requests))
    assert results["fine"].label is not None
    assert results["too long"].attempts == 1 and "HTTP 400" in results["too long"].error

    with (
        OracleServer(lambda payload, headers: Reply(status=404, body="model not found")) as server,
        pytest.raises(OracleError, match="HTTP 404.*model not found"),
    ):
        list(_oracle(server, max_concurrency=1).label(_requests(20)))
    assert len(server.calls) <= 2  # stopped, the rest were never sent


def test_concurrency_is_bounded_and_every_request_answered():
    def respond(payload, headers):
        return Reply(body=completion(json.dumps(SCORES)), delay_s=0.05)

    with OracleServer(respond) as server:
        results = list(_oracle(server, max_concurrency=3).label(_requests(12)))
    assert sorted(r.request.id for r in results) == sorted(r.id for r in _requests(12))
    assert 2 <= server.peak_in_flight <= 3


def _echo_headers(payload, headers) -> Reply:
    """A misconfigured proxy that answers with the request's headers, in several places."""
    echoed = json.dumps(headers)
    if document_of(payload).startswith("server"):
        return Reply(status=500, body=f"upstream failed; request was {echoed}")
    return Reply(body=completion(f"headers seen: {echoed}; Authorization: Bearer {KEY}"))


def test_the_key_never_reaches_messages_the_lake_or_logs(tmp_path, monkeypatch, caplog):
    """Issue 6, item 13: a header-echoing server put the key into the event log."""
    monkeypatch.setenv("TEST_ORACLE_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    lake = Lake(tmp_path / "lake")
    requests = _requests(2, "server") + _requests(2, "reply")
    with OracleServer(_echo_headers) as server:
        report = label_documents(
            requests, _oracle(server, max_retries=1), LabelCache(lake), LabellingConfig()
        )
        assert server.calls[0].headers["authorization"] == f"Bearer {KEY}"  # the key was sent...
        with pytest.raises(OracleError) as raised:
            fatal = OracleServer(lambda payload, headers: Reply(status=401, body=json.dumps(headers)))
            with fatal:
                list(_oracle(fatal).label(_requests(1)))
    assert report.failures.num_rows == 4 and report.labels.num_rows == 0
    texts = [str(raised.value), caplog.text, *map(str, report.failures.to_pylist())]
    lake.write_table(report.failures, "oracle_label_failures")
    for path in sorted((tmp_path / "lake").rglob("*")):
        if path.is_file():
            texts.append(path.read_bytes().decode("latin-1"))
            if path.suffix == ".parquet":
                import pyarrow.parquet as pq

                texts.append(str(pq.read_table(path).to_pylist()))
    assert "[redacted]" in texts[0] and "[redacted]" in texts[2]
    for text in texts:
        assert KEY not in text  # ...and is nowhere in what came back
        assert "Bearer sk-" not in text


def test_redact_covers_header_styles():
    secret = "abc123secret"
    for raw in [
        f"Authorization: Bearer {secret}",
        f'{{"authorization": "Bearer {secret}"}}',
        f"{{'Authorization': 'Basic {secret}'}}",
        f"x-api-key: {secret}",
        f"api-key={secret}&model=m",
        f'"api_key": "{secret}"',
        f"https://user:{secret}@vllm.internal/v1",
    ]:
        assert secret not in redact(raw), raw
    assert redact(f"the key {secret} leaked", [secret]) == "the key [redacted] leaked"
