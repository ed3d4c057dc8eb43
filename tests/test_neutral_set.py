"""The neutral evaluation set: drawn from raw ids alone, excluded from training with its copies; user
sets read with clear errors; tokenised in the layout the trainer's evaluation reads."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe_dag.data.mixture.heldout import heldout_cut
from moe_dag.data.mixture.neutral import (
    EvaluationConfig,
    neutral_cut,
    read_user_set,
    select_neutral,
    without_excluded,
    write_evaluation_set,
)
from moe_dag.data.tokenizer import TokenizerConfig, eos_id, train_tokenizer
from moe_dag.training.data import read_heldout, read_mixture


def _raw(source: str, count: int) -> pa.Table:
    return pa.table(
        {"id": [f"{source}/{i}" for i in range(count)], "text": [f"{source} text {i}" for i in range(count)]}
    )


def test_the_sample_depends_on_the_ids_alone_and_differs_from_the_heldout_cut() -> None:
    ids = [f"web/{i}" for i in range(500)]
    assert neutral_cut(ids, 20) == neutral_cut(list(reversed(ids)), 20)
    # Filters remove documents, never add: the sample of what they keep is the raw sample minus drops.
    table = pa.table({"id": ids, "text": ids})
    documents, _ = select_neutral(["web"], lambda source: iter([table]), 20, None)
    chosen = set(documents["id"].to_pylist())
    assert len(chosen) == 20
    assert heldout_cut(ids, 0.0, 20) != neutral_cut(ids, 20)  # a salted hash: another sample


def test_copies_of_neutral_documents_are_excluded_with_their_reason() -> None:
    raw = {"a": _raw("a", 40), "b": _raw("b", 40)}
    documents, _ = select_neutral(["a", "b"], lambda s: iter([raw[s]]), 3, None)
    first = documents.slice(0, 1).to_pylist()[0]
    # b/39 repeats a neutral text exactly; b/38 sits in a neutral document's dedup cluster.
    texts = raw["b"]["text"].to_pylist()
    texts[39] = first["text"]
    raw["b"] = pa.table({"id": raw["b"]["id"], "text": texts})
    clusters = pa.table({"id": [first["id"], "b/38"], "cluster_id": ["k", "k"]})
    documents, excluded = select_neutral(["a", "b"], lambda s: iter([raw[s]]), 3, clusters)
    reasons = dict(zip(excluded["id"].to_pylist(), excluded["reason"].to_pylist(), strict=True))
    assert documents.num_rows == 6
    assert {i for i, r in reasons.items() if r == "neutral"} == set(documents["id"].to_pylist())
    assert reasons.get("b/39") == "exact_copy" and reasons.get("b/38") == "near_copy"
    kept = without_excluded(raw["b"], frozenset(reasons))
    assert not set(kept["id"].to_pylist()) & set(reasons)
    assert kept.num_rows + sum(1 for i in reasons if i.startswith("b/")) == 40


def test_a_bad_line_in_a_user_set_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "1", "text": "fine"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"mine\.jsonl line 2"):
        read_user_set("mine", str(path))
    with pytest.raises(ValueError, match="letters, digits"):
        EvaluationConfig(user_sets={"neutral": str(path)})


def test_a_set_is_written_as_the_trainer_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["grüße aus dem test", "hello world"]}), path)
    documents = read_user_set("mine", str(path))
    tokenizer = train_tokenizer(["hello world grüße"] * 20, TokenizerConfig(vocab_size=300))
    write_evaluation_set(documents, tokenizer, eos_id(tokenizer), 32, tmp_path / "set")
    heldout = read_heldout(tmp_path / "set")
    assert heldout["source"] == ["mine", "mine"] and heldout["id"] == ["mine/x", "mine/y"]
    assert heldout["num_bytes"][0] == len("grüße aus dem test".encode())
    assert read_mixture(tmp_path / "set").vocab_size == tokenizer.get_vocab_size(with_added_tokens=True)


def test_a_small_source_gives_at_most_a_share_to_the_neutral_set():
    """A 30-document source with the default 100 a source would otherwise lose all of its text."""
    table = pa.table({"id": [f"s{i}" for i in range(30)], "text": [f"text {i}" for i in range(30)]})
    documents, _ = select_neutral(["small"], lambda source: iter([table]), 100, None)
    assert documents.num_rows == 3  # neutral_max_share 0.1
    documents, _ = select_neutral(["small"], lambda source: iter([table]), 100, None, max_share=0.5)
    assert documents.num_rows == 15
