"""Issue 23, items 3 and 8: an oracle reply of any shape is one bad reply for its document (retried,
then a failure, the run going on), and no piece of the key of 4 or more characters reaches a message,
however the text around it is cut."""

from __future__ import annotations

import json

import pytest

from moe_dag.quality.oracle import (
    LabelCache,
    LabellingConfig,
    LabelRequest,
    OpenAICompatibleConfig,
    OpenAICompatibleOracle,
    label_documents,
    redact,
)
from moe_dag.storage.lake import Lake
from tests.oracle_server import OracleServer, Reply, completion, document_of, scores_reply

SCORES = {"helpfulness": 3, "correctness": 4, "coherence": 4, "complexity": 2, "verbosity": 2}
KEY = "sk-live-9f3K2xQ7mZ8pL4vR1nT6"

ODD_REPLIES = {
    "content_object": {"choices": [{"message": {"role": "assistant", "content": {"a": 2}}}]},
    "content_list": {"choices": [{"message": {"role": "assistant", "content": [1, 2]}}]},
    "content_number": {"choices": [{"message": {"role": "assistant", "content": 7}}]},
    "message_text": {"choices": [{"message": "hello"}]},
    "choice_text": {"choices": ["hello"]},
    "choices_object": {"choices": {"0": {}}},
    "body_list": [1, 2, 3],
    "body_null": None,
    "refusal_object": {"choices": [{"message": {"refusal": {"why": "no"}, "content": None}}]},
    "deep_json": completion("[" * 100_000 + "]" * 100_000),
    "scores_nested": completion(json.dumps({name: {"v": 1} for name in SCORES})),
    "scores_list": completion(json.dumps([SCORES])),
}


def _oracle(server: OracleServer, **overrides) -> OpenAICompatibleOracle:
    settings = {"base_url": server.url, "backoff_s": 0.0, "api_key_env": "TEST_ORACLE_KEY"} | overrides
    return OpenAICompatibleOracle(OpenAICompatibleConfig(**settings))


def test_a_reply_of_any_shape_is_one_bad_reply_and_the_run_goes_on(tmp_path):
    def respond(payload, headers):
        document = document_of(payload)
        if document in ODD_REPLIES:
            body = ODD_REPLIES[document]
            return Reply(body=json.dumps(body))
        return scores_reply(SCORES)

    good = [f"good {i}" for i in range(6)]
    requests = [
        LabelRequest(id=text, text=text, source="web", rubric="general") for text in [*ODD_REPLIES, *good]
    ]
    with OracleServer(respond) as server:
        report = label_documents(
            requests, _oracle(server, max_retries=1), LabelCache(Lake(tmp_path / "lake")), LabellingConfig()
        )
    assert sorted(report.labels["id"].to_pylist()) == sorted(good)
    failures = {row["id"]: row for row in report.failures.to_pylist()}
    assert set(failures) == set(ODD_REPLIES)
    for name, row in failures.items():
        assert row["attempts"] == 2, name  # retried once, then a failure of that document only
        assert row["error"].startswith("no valid label after 2 attempts"), (name, row["error"])
        assert len(row["replies"]) == 2, (name, row["replies"])
    assert sum(call.document.startswith("good") for call in server.calls) == len(good)


def _pieces(secret: str, size: int = 4) -> list[str]:
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


@pytest.mark.parametrize("padding", [180, 190, 480, 490, 495, 1980, 1990])
@pytest.mark.parametrize("status", [200, 400, 500])
def test_no_piece_of_the_key_survives_truncation(tmp_path, monkeypatch, padding, status):
    """The reproduction: padding, then "presented <key>", so that a cut at 200, 500 or 2000 characters
    falls inside the key."""
    monkeypatch.setenv("TEST_ORACLE_KEY", KEY)
    text = "x" * padding + f" presented {KEY} and more"

    def respond(payload, headers):
        if status == 200:
            return Reply(body=completion(text))
        return Reply(status=status, body=text)

    requests = [LabelRequest(id="doc", text="doc", source="web", rubric="general")]
    with OracleServer(respond) as server:
        report = label_documents(
            requests, _oracle(server, max_retries=1), LabelCache(Lake(tmp_path / "lake")), LabellingConfig()
        )
    (row,) = report.failures.to_pylist()
    for message in [row["error"], *row["replies"]]:
        leaked = [piece for piece in _pieces(KEY) if piece in message]
        assert not leaked, (leaked, message[-120:])


def test_redact_removes_every_piece_of_four_or_more_characters():
    cut = f"header: {KEY[:9]}"
    assert KEY[:9] not in redact(cut, [KEY]) and "[redacted]" in redact(cut, [KEY])
    assert redact(f"...{KEY[-5:]} tail", [KEY]) == "...[redacted] tail"
    assert redact("a key-less message", [KEY]) == "a key-less message"
    assert redact(f"ends with {KEY[:3]}", [KEY]) == f"ends with {KEY[:3]}"  # 3 characters say nothing


# Issue 35, item 6: the body itself nested 200,000 deep (not only the message content inside it) raised
# RecursionError out of the labelling run, and every rerun failed the same way; an unbounded body is read
# whole into memory.
HOSTILE_BODIES = {
    "body_deep": "[" * 200_000 + "]" * 200_000,
    "body_deep_object": '{"c":' * 150_000 + "null" + "}" * 150_000,
    "body_huge": json.dumps(completion(json.dumps(SCORES) + " " * 3_000_000)),
}


def test_a_hostile_body_is_one_failed_document_and_the_run_goes_on(tmp_path):
    def respond(payload, headers):
        document = document_of(payload)
        return Reply(body=HOSTILE_BODIES[document]) if document in HOSTILE_BODIES else scores_reply(SCORES)

    good = [f"good {i}" for i in range(3)]
    requests = [
        LabelRequest(id=text, text=text, source="web", rubric="general") for text in [*HOSTILE_BODIES, *good]
    ]
    with OracleServer(respond) as server:
        report = label_documents(
            requests, _oracle(server, max_retries=1), LabelCache(Lake(tmp_path / "lake")), LabellingConfig()
        )
    assert sorted(report.labels["id"].to_pylist()) == sorted(good)
    failures = {row["id"]: row for row in report.failures.to_pylist()}
    assert set(failures) == set(HOSTILE_BODIES)
    assert "nested too deeply" in failures["body_deep"]["error"]
    assert "nested too deeply" in failures["body_deep_object"]["error"]
    assert "over the 1048576-byte limit" in failures["body_huge"]["error"]
    assert all(len(reply) <= 2000 for row in failures.values() for reply in row["replies"])
