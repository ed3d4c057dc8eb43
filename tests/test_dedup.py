"""Exact and MinHash near-duplicate clustering: which documents merge, who survives, and the LSH maths."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.data.dedup import (
    MinHashConfig,
    apply_dedup,
    candidate_probability,
    compute_signatures,
    find_duplicate_clusters,
    normalize_text,
)

CONFIG = MinHashConfig()
PRIORITY = ["reference", "web", "code"]
PARAGRAPH = (
    "the river runs through the old town past the mill where bread was baked every morning while "
    "children walked along the water to school counting boats tied to wooden posts in winter and "
    "farmers carried their harvest across the stone bridge to the market near the station"
)
VOCABULARY = sorted(set(PARAGRAPH.split()))


def random_document(seed: int, words: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(VOCABULARY) for _ in range(words)]


def table(docs: dict[str, tuple[str, str]]) -> pa.Table:
    """{id: (source, text)} as a document table."""
    return pa.table(
        {"id": list(docs), "source": [s for s, _ in docs.values()], "text": [t for _, t in docs.values()]}
    )


def clusters_by_id(docs: dict[str, tuple[str, str]], priority=PRIORITY) -> dict[str, dict]:
    signatures = compute_signatures(table(docs), CONFIG)
    clusters = find_duplicate_clusters(signatures, CONFIG, priority)
    return {row["id"]: row for row in clusters.to_pylist()}


BASE = random_document(0)
EDITED = list(BASE)
EDITED[40], EDITED[110], EDITED[170] = "lighthouse", "orchard", "quarry"  # 3 word edits in 200 words


def test_normalisation_ignores_case_punctuation_and_spacing():
    assert normalize_text("Hello,   World!\n\tIt's  *fine*_here.") == "hello world it s fine here"


def test_signature_table_shape():
    signatures = compute_signatures(table({"a": ("web", " ".join(BASE)), "b": ("web", "")}), CONFIG)
    assert signatures.column_names == ["id", "source", "content_hash", "signature"]
    assert signatures.schema.field("signature").type == pa.list_(pa.uint32())
    assert [len(s) for s in signatures["signature"].to_pylist()] == [CONFIG.num_hashes] * 2


def test_exact_duplicate_after_normalisation():
    text = " ".join(BASE)
    got = clusters_by_id({"a": ("web", text), "b": ("web", text.upper().replace(" ", "  ") + "!")})
    assert got["a"]["is_survivor"] and got["a"]["duplicate_of"] is None
    assert got["b"]["duplicate_of"] == "a" and got["b"]["match"] == "exact" and got["b"]["jaccard"] == 1.0


def test_near_duplicate_with_three_word_edits_is_found():
    got = clusters_by_id({"a": ("web", " ".join(BASE)), "b": ("web", " ".join(EDITED))})
    assert got["b"]["duplicate_of"] == "a" and got["b"]["match"] == "near"
    # 3 edits change 15 of 196 five-grams: true Jaccard 181 / 211 = 0.86, estimated within ~2 s.e.
    assert 0.78 <= got["b"]["jaccard"] <= 0.94


def test_unrelated_documents_stay_apart():
    docs = {str(i): ("web", " ".join(random_document(i))) for i in range(1, 6)}
    got = clusters_by_id(docs)
    assert all(row["is_survivor"] and row["cluster_id"] == row["id"] for row in got.values())
    assert all(row["match"] is None and row["jaccard"] is None for row in got.values())


def test_short_documents_are_one_shingle():
    got = clusters_by_id(
        {"a": ("web", "Hello world"), "b": ("web", "hello, world"), "c": ("web", "Hello there")}
    )
    assert got["b"]["match"] == "exact" and got["c"]["is_survivor"]


def test_cross_source_cluster_survivor_follows_source_priority():
    docs = {
        "w1": ("web", " ".join(BASE)),
        "c1": ("code", " ".join(BASE)),
        "r9": ("reference", " ".join(EDITED)),
        "w0": ("web", " ".join(EDITED)),
    }
    got = clusters_by_id(docs)
    assert {row["cluster_id"] for row in got.values()} == {"r9"}
    assert [id_ for id_, row in got.items() if row["is_survivor"]] == ["r9"]
    assert got["w1"]["match"] == "near" and got["w0"]["match"] == "exact"

    reordered = clusters_by_id(docs, priority=["web", "code", "reference"])
    # Among web documents the lower id wins.
    assert {row["cluster_id"] for row in reordered.values()} == {"w0"}


def test_clusters_are_deterministic_across_runs_and_row_orders():
    docs = {f"d{i}": ("web", " ".join(BASE if i % 2 else EDITED)) for i in range(6)}
    first = compute_signatures(table(docs), CONFIG)
    second = compute_signatures(table(docs), CONFIG)
    assert first.equals(second)
    shuffled = dict(sorted(docs.items(), reverse=True))
    assert clusters_by_id(docs) == clusters_by_id(shuffled)
    other_seed = compute_signatures(table(docs), MinHashConfig(seed=2))
    assert other_seed["signature"] != first["signature"]


def test_apply_dedup_keeps_every_row_with_a_reason():
    docs = {"a": ("web", " ".join(BASE)), "b": ("web", " ".join(BASE)), "c": ("web", " ".join(EDITED))}
    documents = table(docs)
    clusters = find_duplicate_clusters(compute_signatures(documents, CONFIG), CONFIG, PRIORITY)
    out = apply_dedup(documents, clusters)
    assert out.num_rows == 3 and out["text"].equals(documents["text"])
    assert out["keep"].to_pylist() == [True, False, False]
    assert out["reason"].to_pylist() == [None, "exact_duplicate", "near_duplicate"]
    assert out["duplicate_of"].to_pylist() == [None, "a", "a"]
    assert out["cluster_id"].to_pylist() == ["a", "a", "a"]


def test_apply_dedup_names_a_missing_id():
    documents = table({"a": ("web", "one text"), "b": ("web", "another text")})
    clusters = find_duplicate_clusters(compute_signatures(documents.slice(0, 1), CONFIG), CONFIG, PRIORITY)
    with pytest.raises(ValueError, match="'b' has no row in the clusters table"):
        apply_dedup(documents, clusters)


def test_unknown_source_and_repeated_id_are_rejected():
    signatures = compute_signatures(table({"a": ("news", "text")}), CONFIG)
    with pytest.raises(ValueError, match=r"sources \['news'\] are not in source_priority"):
        find_duplicate_clusters(signatures, CONFIG, PRIORITY)
    twice = pa.concat_tables([signatures, signatures])
    with pytest.raises(ValueError, match="document id 'a' appears more than once"):
        find_duplicate_clusters(twice, CONFIG, ["news"])


def test_candidate_probability_formula():
    assert candidate_probability(0.8, 14, 8) == pytest.approx(0.9235, abs=1e-4)
    assert candidate_probability(0.5, 14, 8) == pytest.approx(0.0533, abs=1e-4)
    assert candidate_probability(1.0, 14, 8) == 1.0 and candidate_probability(0.0, 14, 8) == 0.0


def test_candidate_rate_matches_formula_at_jaccard_0_8():
    """Over 200 seeds, sets with Jaccard exactly 0.8 share a band about 92% of the time."""
    shared = [f"s{i}" for i in range(80)]
    pair = table(
        {
            "a": ("web", " ".join(shared + [f"a{i}" for i in range(10)])),
            "b": ("web", " ".join(shared + [f"b{i}" for i in range(10)])),
        }
    )  # |A & B| / |A | B| = 80 / 100
    hits, estimates = 0, []
    for seed in range(200):
        config = MinHashConfig(ngram_size=1, seed=seed)
        sig_a, sig_b = (np.array(s) for s in compute_signatures(pair, config)["signature"].to_pylist())
        bands_equal = (sig_a == sig_b).reshape(config.num_bands, config.rows_per_band).all(axis=1)
        hits += bool(bands_equal.any())
        estimates.append((sig_a == sig_b).mean())
    assert abs(hits / 200 - candidate_probability(0.8, 14, 8)) < 0.06  # 3 binomial s.e.
    assert abs(np.mean(estimates) - 0.8) < 0.01
