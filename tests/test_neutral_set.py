"""The neutral evaluation set: drawn from raw ids alone, one id at a time (a new shard moves no old
document in or out), excluded from training with its copies; user sets read with clear errors;
tokenised in the layout the trainer's evaluation reads."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moe_dag.curation.dedup.clusters import cluster_mates
from moe_dag.mixture.heldout import heldout_cut
from moe_dag.mixture.neutral import (
    NEUTRAL_STAGE,
    EvaluationConfig,
    Exclusions,
    ids_digest,
    is_neutral,
    read_user_set,
    select_neutral,
    select_neutral_in_tasks,
    without_excluded,
    write_evaluation_set,
    write_exclusions,
)
from moe_dag.mixture.sampler import stable_hash
from moe_dag.mixture.tokenizer import TokenizerConfig, eos_id, train_tokenizer
from moe_dag.storage.lake import Lake
from moe_dag.training.data import read_heldout, read_mixture


def _raw(source: str, count: int) -> pa.Table:
    return pa.table(
        {"id": [f"{source}/{i}" for i in range(count)], "text": [f"{source} text {i}" for i in range(count)]}
    )


def test_the_sample_depends_on_the_ids_alone_and_differs_from_the_heldout_cut() -> None:
    ids = [f"web/{i}" for i in range(500)]
    table = pa.table({"id": ids, "text": ids})
    documents, _ = select_neutral(["web"], lambda source: iter([table]), 0.05, None)
    shuffled = table.take(list(reversed(range(500))))
    again, _ = select_neutral(
        ["web"], lambda source: iter([shuffled.slice(0, 200), shuffled.slice(200)]), 0.05
    )
    chosen = set(documents["id"].to_pylist())
    assert chosen == set(again["id"].to_pylist())
    assert 10 <= len(chosen) <= 45  # 25 expected
    # Filters remove documents, never add: the sample of what they keep is the raw sample minus drops.
    kept = [i for i in ids if i not in chosen][:300] + sorted(chosen)[:5]
    assert {i for i, n in zip(kept, is_neutral(pa.array(kept), 0.05).to_pylist(), strict=True) if n} == set(
        sorted(chosen)[:5]
    )
    # A salted hash: the held-out sample of as many documents is another one.
    cut = heldout_cut(ids, 0.0, len(chosen))
    heldout = {i for i in ids if stable_hash(i) <= cut}
    assert len(heldout) == len(chosen) and heldout != chosen


def test_a_new_shard_moves_no_old_document_in_or_out() -> None:
    """Membership is per id: the old members stay, no old non-member enters, the shard brings its own
    (a lowest-N sample would let new low hashes push old members out)."""
    old = pa.table({"id": [f"web/{i}" for i in range(400)], "text": [f"old {i}" for i in range(400)]})
    new = pa.table({"id": [f"web/new-{i}" for i in range(400)], "text": [f"new {i}" for i in range(400)]})
    before, _ = select_neutral(["web"], lambda source: iter([old]), 0.1)
    after, _ = select_neutral(["web"], lambda source: iter([old, new]), 0.1)
    members = set(after["id"].to_pylist())
    assert {i for i in members if not i.startswith("web/new-")} == set(before["id"].to_pylist())
    assert any(i.startswith("web/new-") for i in members)


def test_copies_of_neutral_documents_are_excluded_with_their_reason() -> None:
    raw = {"a": _raw("a", 200), "b": _raw("b", 200)}
    documents, _ = select_neutral(["a", "b"], lambda s: iter([raw[s]]), 0.05)
    first = documents.slice(0, 1).to_pylist()[0]
    # b/199 repeats a neutral text exactly; b/198 sits in a neutral document's dedup cluster.
    texts = raw["b"]["text"].to_pylist()
    texts[199] = first["text"]
    raw["b"] = pa.table({"id": raw["b"]["id"], "text": texts})
    clusters = pa.table({"id": [first["id"], "b/198", "b/197"], "cluster_id": ["k", "k", "b/197"]})
    mates = functools.partial(cluster_mates, clusters)
    documents, excluded = select_neutral(["a", "b"], lambda s: iter([raw[s]]), 0.05, mates)
    reasons = dict(zip(excluded["id"].to_pylist(), excluded["reason"].to_pylist(), strict=True))
    assert {i for i, r in reasons.items() if r == "neutral"} == set(documents["id"].to_pylist())
    assert reasons.get("b/199") == "exact_copy" and reasons.get("b/198") == "near_copy"
    assert "b/197" not in reasons or reasons["b/197"] == "neutral"
    kept = without_excluded(raw["b"], frozenset(reasons))
    assert not set(kept["id"].to_pylist()) & set(reasons)
    assert kept.num_rows + sum(1 for i in reasons if i.startswith("b/")) == 200


@pytest.mark.parametrize("with_clusters", [True, False])
def test_the_selection_made_in_tasks_is_the_selection_made_here(tmp_path: Path, with_clusters: bool) -> None:
    """Raw text read per file in tasks (here: the same functions in this process), the documents written
    per file, only ids and hashes back: the same documents, exclusions and digest as `select_neutral`."""
    lake = Lake(tmp_path / "lake")
    raw = {"a": _raw("a", 300), "b": _raw("b", 200)}
    texts = raw["b"]["text"].to_pylist()
    texts[150:153] = [raw["a"]["text"][i].as_py() for i in (7, 9, 8)]  # copies of a/7, a/9 (neutral), a/8
    raw["b"] = pa.table({"id": raw["b"]["id"], "text": texts})
    for source, table in raw.items():
        for key, part in (("s0", table.slice(0, 120)), ("s1", table.slice(120, 0)), ("s2", table.slice(120))):
            lake.write_file(part, lake.shard_path("raw_documents", source, key))
    lake.write_file(pa.table({"id": ["x"], "text": ["x"]}), lake.dataset_dir(NEUTRAL_STAGE) + "/old.parquet")
    neutral_ids = select_neutral(["b", "a"], lambda s: iter([raw[s]]), 0.1)[0]["id"].to_pylist()
    clusters = pa.table({"id": [neutral_ids[0], "a/11", "b/9"], "cluster_id": ["k", "k", "b/9"]})
    lake.write_table(clusters, "dedup_clusters")
    glob = lake.glob_pattern("dedup_clusters", partitioned=False) if with_clusters else None
    mates = functools.partial(cluster_mates, clusters) if with_clusters else None

    documents, exclusions = select_neutral(
        ["b", "a"], lambda s: lake.iter_batches("raw_documents", s), 0.1, mates
    )
    selected = select_neutral_in_tasks(lake, ["b", "a"], 0.1, glob)
    written = lake.read_table(NEUTRAL_STAGE)
    assert sorted(written.to_pylist(), key=str) == sorted(documents.to_pylist(), key=str)
    assert selected.exclusions.equals(exclusions)
    assert ("near_copy" in exclusions["reason"].to_pylist()) == with_clusters
    assert "exact_copy" in exclusions["reason"].to_pylist()
    assert selected.per_source == dict(Counter(documents["source"].to_pylist()))
    assert selected.digest == ids_digest(documents["id"], exclusions["id"])
    write_exclusions(lake, selected.exclusions, selected.digest)
    handle = Exclusions(lake.url)
    assert handle.digest() == selected.digest and handle.ids() == frozenset(exclusions["id"].to_pylist())


def test_cluster_mates_come_from_the_cluster_files_without_the_rest(tmp_path: Path) -> None:
    for name, rows in {"x": [("a", "a"), ("b", "a"), ("c", "c")], "y": [("d", "d"), ("e", "c")]}.items():
        pq.write_table(
            pa.table({"id": [r[0] for r in rows], "cluster_id": [r[1] for r in rows]}),
            tmp_path / f"{name}.parquet",
        )
    assert cluster_mates(str(tmp_path / "*.parquet"), ["b", "e"]) == ["a", "b", "c", "e"]
    assert cluster_mates(str(tmp_path / "*.parquet"), ["d"]) == ["d"]


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


def test_each_source_gives_about_its_share_and_the_share_is_checked() -> None:
    for count in (30, 3000):
        table = pa.table({"id": [f"s{count}/{i}" for i in range(count)], "text": ["t"] * count})
        documents, _ = select_neutral(["s"], lambda source, t=table: iter([t]), 0.1)
        assert documents.num_rows <= 0.1 * count + 3 * (0.09 * count) ** 0.5 + 1
    assert select_neutral(["s"], lambda source: iter([table]), 0.0)[0].num_rows == 0
    with pytest.raises(ValueError, match="neutral_share"):
        EvaluationConfig(neutral_share=1.0)
