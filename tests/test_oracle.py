"""Rubrics, the rule-based oracle, the label table and the samples (HTTP oracle: test_oracle_http.py)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.quality.oracle import (
    CODE,
    GENERAL,
    PROMPT_VERSION,
    LabelRequest,
    RuleBasedOracle,
    labels_to_table,
    requests_from_table,
    rubric_for_kind,
    split_sample,
    stratified_sample,
    table_to_labels,
)
from moe_dag.storage.schema import SOURCE_KINDS

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


def test_rubric_follows_the_kind_and_unknown_kinds_are_refused():
    assert rubric_for_kind("code") is CODE
    assert all(rubric_for_kind(kind) is GENERAL for kind in SOURCE_KINDS if kind != "code")
    for kind in ("cc", "cdoe", "Code", ""):
        with pytest.raises(ValueError, match="unknown source kind"):
            rubric_for_kind(kind)


def test_rubric_quality_and_weighted_aggregate():
    assert CODE.quality(dict.fromkeys(CODE.dimensions, 10)) == 1.0
    assert CODE.quality(dict.fromkeys(CODE.dimensions, 5)) == 0.5
    best = {"helpfulness": 4, "correctness": 4, "coherence": 4, "complexity": 4, "verbosity": 2}
    assert GENERAL.quality(best) == 1.0
    # Verbosity is best in the middle: padding costs as much as terseness.
    assert GENERAL.quality(best | {"verbosity": 4}) == GENERAL.quality(best | {"verbosity": 0}) == 0.8
    normalised = np.array([GENERAL.normalise(best | {"verbosity": 4}), GENERAL.normalise(best)])
    np.testing.assert_allclose(GENERAL.aggregate(normalised), [0.8, 1.0])
    # A configured aggregate that ignores verbosity rates padding like the ideal length.
    np.testing.assert_allclose(GENERAL.aggregate(normalised, {"verbosity": 0.0}), [1.0, 1.0])
    np.testing.assert_allclose(GENERAL.aggregate(np.full((1, 5), np.nan)), [np.nan])


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


def _labels(requests: list[LabelRequest]) -> list:
    return [result.label for result in RuleBasedOracle().label(requests)]


def test_rule_oracle_ranks_clean_text_above_junk_and_is_deterministic():
    prose, spam, symbols = _labels([_request(PROSE), _request(SPAM), _request(SYMBOLS)])
    assert prose.quality > spam.quality > symbols.quality
    assert prose.scores["correctness"] == 4 and symbols.scores["correctness"] == 0
    assert spam.scores["correctness"] < prose.scores["correctness"]
    assert _labels([_request(PROSE)]) == [prose]
    assert prose.model == "rules-v2" and prose.prompt_version == PROMPT_VERSION


def test_rule_oracle_ranks_structured_code_above_a_flat_script():
    good, bad = _labels([_request(GOOD_CODE, "code"), _request(BAD_CODE, "code")])
    assert set(good.scores) == set(CODE.dimensions)
    for dim in ("modularity", "clarity", "reusability"):
        assert good.scores[dim] > bad.scores[dim], dim
    assert good.quality > bad.quality + 0.3


def test_requests_take_the_rubric_from_the_source_kind_not_its_name():
    docs = pa.table(
        {"id": ["a", "b", "c"], "text": [PROSE, GOOD_CODE, PROSE], "source": ["code", "py", "cc"]}
    )
    requests = requests_from_table(docs, {"code": "web", "py": "code", "cc": "web"})
    assert [r.rubric for r in requests] == ["general", "code", "general"]
    with pytest.raises(ValueError, match="no kind known for source 'cc'"):
        requests_from_table(docs, {"code": "web", "py": "code"})


def test_label_table_round_trip():
    docs = pa.table({"id": ["a", "b"], "text": [PROSE, GOOD_CODE], "source": ["cc", "code"]})
    requests = requests_from_table(docs, {"cc": "web", "code": "code"})
    assert [r.rubric for r in requests] == ["general", "code"]
    labels = _labels(requests)
    table = labels_to_table(labels)
    assert table["score_readability"].to_pylist()[0] is None
    assert table["score_readability"].to_pylist()[1] == labels[1].scores["readability"]
    assert json.loads(table["scores"][0].as_py()) == labels[0].scores
    assert table_to_labels(table) == labels


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


def test_split_sample_draws_disjoint_label_and_calibration_samples():
    corpus = _corpus()
    labelled, calibration = split_sample(corpus, labelled=8, calibration=20, seed=1)
    assert labelled.equals(stratified_sample(corpus, per_source=8, seed=1))
    assert not set(labelled["id"].to_pylist()) & set(calibration["id"].to_pylist())
    counts = {s: calibration["source"].to_pylist().count(s) for s in ("cc", "code", "math")}
    assert counts == {"cc": 20, "code": 20, "math": 0}  # math's two documents are both being labelled
    _, everything_left = split_sample(corpus, labelled=8, calibration=1000, seed=1)
    assert everything_left.num_rows == corpus.num_rows - labelled.num_rows
