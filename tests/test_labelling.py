"""Labelling through the cache: reruns pay only for new text, a killed run resumes, failures are kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from oracle_server import OracleServer, Reply, document_of, scores_reply

from moe_dag.quality.oracle import (
    LabelCache,
    LabellingConfig,
    LabelRequest,
    OpenAICompatibleConfig,
    OpenAICompatibleOracle,
    OracleError,
    RuleBasedOracle,
    label_documents,
    text_hash,
)
from moe_dag.storage.catalog import Catalog
from moe_dag.storage.lake import Lake

SCORES = {"helpfulness": 3, "correctness": 4, "coherence": 4, "complexity": 2, "verbosity": 2}
REPO = Path(__file__).resolve().parents[1]


class CountingOracle(RuleBasedOracle):
    def __init__(self, model_name: str = "rules-v1"):
        self.model_name = model_name
        self.asked: list[str] = []

    def label(self, requests):
        self.asked += [r.id for r in requests]
        yield from super().label(requests)


def _requests(texts: list[str], rubric: str = "general") -> list[LabelRequest]:
    return [LabelRequest(id=f"d{i}", text=t, source="web", rubric=rubric) for i, t in enumerate(texts)]


TEXTS = [
    f"Document number {i} explains how rivers carry sediment to the sea over many years." for i in range(30)
]


def test_reruns_pay_only_for_new_text_and_the_cache_is_keyed_by_model(tmp_path):
    cache = LabelCache(Lake(tmp_path))
    oracle = CountingOracle()
    first = label_documents(_requests(TEXTS), oracle, cache, LabellingConfig(commit_every=7))
    assert first.newly_labelled == 30 and first.from_cache == 0 and len(cache.parts()) == 5  # 7+7+7+7+2

    oracle.asked.clear()
    grown = TEXTS + ["A new document about tides.", "Another new one, about glaciers."]
    second = label_documents(_requests(grown), oracle, cache, LabellingConfig())
    assert oracle.asked == ["d30", "d31"] and second.from_cache == 30 and second.newly_labelled == 2
    assert second.labels.num_rows == 32 and second.failures.num_rows == 0
    assert second.labels["id"].to_pylist() == [f"d{i}" for i in range(32)]
    assert second.labels.slice(0, 30)["scores"].equals(first.labels["scores"])

    duplicated = [LabelRequest(id="twin", text=TEXTS[0], source="books", rubric="general")]
    assert label_documents(duplicated, oracle, cache, LabellingConfig()).from_cache == 1  # same text, any id
    as_code = label_documents(_requests(TEXTS[:3], "code"), oracle, cache, LabellingConfig())
    assert as_code.newly_labelled == 3  # another rubric is another key
    other_model = CountingOracle("rules-v2")
    label_documents(_requests(TEXTS[:4] + TEXTS[:4]), other_model, cache, LabellingConfig())
    assert len(other_model.asked) == 4  # another model is another key; identical texts asked once


def test_the_cache_is_a_duckdb_view_and_compaction_keeps_it_whole(tmp_path):
    lake = Lake(tmp_path / "lake")
    cache = LabelCache(lake)
    label_documents(
        _requests(TEXTS), CountingOracle(), cache, LabellingConfig(commit_every=3, compact_above=100)
    )
    assert len(cache.parts()) == 10
    assert cache.compact(above=4) == 10 and len(cache.parts()) == 1
    oracle = CountingOracle()
    again = label_documents(_requests(TEXTS), oracle, cache, LabellingConfig())
    assert oracle.asked == [] and again.from_cache == 30
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    assert "oracle_label_cache" in catalog.refresh()
    rows = catalog.query(
        "SELECT count(*), count(DISTINCT text_hash), min(model), min(prompt_version), max(score_correctness) "
        "FROM oracle_label_cache"
    )
    assert rows[0][:4] == (30, 30, "rules-v1", "rubric-v1") and rows[0][4] is not None


def _poisoned(payload, headers) -> Reply:
    if document_of(payload) == "text 37":
        return Reply(body={"choices": [{"message": {"content": "I'd rather not score this."}}]})
    return scores_reply(SCORES)


def test_one_poisoned_document_among_100_leaves_99_labels(tmp_path):
    requests = [
        LabelRequest(id=f"d{i}", text=f"text {i}", source="web", rubric="general") for i in range(100)
    ]
    with OracleServer(_poisoned) as server:
        oracle = OpenAICompatibleOracle(
            OpenAICompatibleConfig(base_url=server.url, backoff_s=0, max_retries=2)
        )
        report = label_documents(
            requests, oracle, LabelCache(Lake(tmp_path)), LabellingConfig(commit_every=10)
        )
    assert report.labels.num_rows == 99 and report.failures.num_rows == 1
    assert report.failure_rate == pytest.approx(0.01)
    [failure] = report.failures.to_pylist()
    assert failure["id"] == "d37" and failure["attempts"] == 3 and "not JSON" in failure["error"]
    assert len(failure["replies"]) == 3 and "rather not" in failure["replies"][0]
    assert "d37" not in report.labels["id"].to_pylist()


def test_an_oracle_that_is_down_stops_the_run_keeping_what_was_labelled(tmp_path):
    def respond(payload, headers):
        number = int(document_of(payload).split()[-1])
        return scores_reply(SCORES) if number < 20 else Reply(status=400, body="bad request")

    requests = [
        LabelRequest(id=f"d{i}", text=f"text {i}", source="web", rubric="general") for i in range(100)
    ]
    cache = LabelCache(Lake(tmp_path))
    with OracleServer(respond) as server:
        oracle = OpenAICompatibleOracle(
            OpenAICompatibleConfig(base_url=server.url, backoff_s=0, max_concurrency=1)
        )
        config = LabellingConfig(commit_every=50, max_consecutive_failures=5)
        with pytest.raises(OracleError, match="5 documents in a row"):
            label_documents(requests, oracle, cache, config)
    keys = [(text_hash(r.text), "general") for r in requests]
    assert len(cache.lookup(keys, "openai/gpt-oss-120b", "rubric-v1")) == 20  # committed although under 50


LABELLING_SCRIPT = """
import sys
from moe_dag.storage.lake import Lake
from moe_dag.quality.oracle import (LabelCache, LabellingConfig, LabelRequest, OpenAICompatibleConfig,
                                 OpenAICompatibleOracle, label_documents)
url, lake = sys.argv[1], sys.argv[2]
requests = [LabelRequest(id=f"d{i}", text=f"text {i}", source="web", rubric="general") for i in range(100)]
oracle = OpenAICompatibleOracle(OpenAICompatibleConfig(base_url=url, max_concurrency=2))
report = label_documents(requests, oracle, LabelCache(Lake(lake)), LabellingConfig(commit_every=5))
print(report.labels.num_rows)
"""


@pytest.mark.slow
def test_a_killed_labelling_run_resumes_and_pays_only_for_unlabelled_documents(tmp_path):
    """kill -9 halfway through, then rerun: every document is paid for once, plus what the kill lost."""
    lake_root = tmp_path / "lake"
    with OracleServer(lambda payload, headers: Reply(body=scores_reply(SCORES).body, delay_s=0.02)) as server:
        process = subprocess.Popen(
            [sys.executable, "-c", LABELLING_SCRIPT, server.url, str(lake_root)],
            cwd=REPO,
            env={**os.environ, "TQDM_DISABLE": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while len(server.documents_answered()) < 40 and time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode()
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
        paid_before_kill = set(server.documents_answered())
        assert 40 <= len(paid_before_kill) < 100

        cache = LabelCache(Lake(lake_root))
        requests = [
            LabelRequest(id=f"d{i}", text=f"text {i}", source="web", rubric="general") for i in range(100)
        ]
        committed = cache.lookup(
            [(text_hash(r.text), "general") for r in requests], "openai/gpt-oss-120b", "rubric-v1"
        )
        assert len(committed) >= 30  # batches were committed while the run went on, not at its end
        assert not [p for p in lake_root.rglob(".tmp-*")]  # and no half-written batch is left behind

        calls_before = len(server.calls)
        oracle = OpenAICompatibleOracle(OpenAICompatibleConfig(base_url=server.url, max_concurrency=4))
        report = label_documents(requests, oracle, cache, LabellingConfig())
        resumed = [call.document for call in server.calls[calls_before:]]

    assert report.labels.num_rows == 100 and report.from_cache == len(committed)
    assert len(resumed) == 100 - len(committed) == len(set(resumed))
    assert not set(resumed) & {
        f"text {i}" for i in range(100) if (text_hash(f"text {i}"), "general") in committed
    }
    # Paid twice only for answers not yet committed at the kill: at most a batch and what was in flight.
    assert len(paid_before_kill & set(resumed)) <= 5 + 2
    assert json.loads(report.labels["scores"][0].as_py()) == SCORES
