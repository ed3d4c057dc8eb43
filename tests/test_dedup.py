"""Exact and MinHash near-duplicate clustering: which documents merge, who survives, and the LSH maths."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_dag.curation.dedup import (
    MinHashConfig,
    apply_dedup,
    built_from_version,
    candidate_probability,
    cluster_versions,
    clusters,
    compute_signatures,
    find_duplicate_clusters,
    normalize_text,
    shingle_hashes,
    signature_rows,
)
from moe_dag.curation.dedup import clusters as dedup_clusters
from moe_dag.curation.dedup.report import duplicate_report

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
    assert signatures.column_names == ["id", "source", "content_hash", "signature", "fingerprints"]
    assert signatures.schema.field("signature").type == pa.list_(pa.uint32())
    assert [len(s) for s in signatures["signature"].to_pylist()] == [CONFIG.num_hashes] * 2
    # One fingerprint per shingle (196 of 200 words; one for the empty document), its hash's top half.
    shingles = shingle_hashes(pa.array([" ".join(BASE), ""]), CONFIG.ngram_size)
    assert signatures["fingerprints"].to_pylist() == [
        (shingles.hashes[:196] >> np.uint64(32)).tolist(),
        (shingles.hashes[196:] >> np.uint64(32)).tolist(),
    ]
    estimated = MinHashConfig(verification="estimated")
    assert compute_signatures(table({"a": ("web", "")}), estimated).column_names[-1] == "signature"


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


def test_normalisation_of_non_ascii_text():
    assert (
        normalize_text("Café—naïve “Quoted” x_y 日本語、テキスト。")
        == "café naïve quoted x y 日 本 語 テ キ ス ト"
    )


# Six Chinese sentences; the edit changes one character (早上 -> 晚上 in the first).
CHINESE = (
    "今天早上我们去了城市中心的图书馆，那里有很多关于历史和科学的书籍。我的朋友借了一本关于天文学的书，"
    "他说这本书写得非常清楚。下午我们在公园里散步，并且讨论了书里讲到的行星和恒星。晚上我们一起做了一顿"
    "简单的晚饭，吃完以后又读了几页。明天我们打算再去一次图书馆，找一些关于地理的书。我们希望每个星期都能"
    "这样度过一个安静的周末。"
)
CHINESE_EDITED = CHINESE.replace("今天早上", "今天晚上", 1)


def test_one_character_edit_in_chinese_is_a_near_duplicate():
    """Issue 20, defect 6: a clause between punctuation was one word, so one changed character made the
    pair word-5-gram Jaccard 0.29 and it was not clustered; characters are words in unspaced scripts."""
    assert exact_jaccard(CHINESE, CHINESE_EDITED) > 0.9
    got = clusters_by_id({"a": ("web", CHINESE), "b": ("web", CHINESE_EDITED)})
    assert got["b"]["duplicate_of"] == "a" and got["b"]["match"] == "near"
    different = (
        CHINESE.replace("图书馆", "博物馆").replace("天文学", "植物学").replace("行星和恒星", "花和树")
    )
    assert exact_jaccard(CHINESE, different) < 0.8


def test_thai_and_japanese_characters_are_words():
    assert normalize_text("ภาษาไทย") == "ภ า ษ า ไ ท ย"
    assert normalize_text("図書館で勉強する") == "図 書 館 で 勉 強 す る"


# Signatures of English text computed before unspaced scripts were split (commit 44178f3): stored
# signatures stay valid only while these stay the same.
ENGLISH_CONTENT_HASHES = ["b45cf221aca015a42927d20ecee1e340", "425263dab8ba2501763a633631eaf40d"]
ENGLISH_FIRST_SHINGLES = [16198422064112774423, 9165868213336824131, 15266204844070351254]


def test_english_shingles_are_unchanged():
    """Splitting unspaced scripts must not touch text without them: the shingle hashes of English (and
    of accented Latin) text are those computed before the change, so stored signatures stay valid."""
    texts = [" ".join(BASE), "Café naïve, déjà vu — “quoted” words and more words here."]
    hashes = shingle_hashes(pa.array(texts), 5)
    assert hashes.content_hashes == ENGLISH_CONTENT_HASHES
    assert [int(h) for h in hashes.hashes[:3]] == ENGLISH_FIRST_SHINGLES


def word_ngrams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """The brute-force reference: word n-grams of the normalised text (one of all words if shorter)."""
    words = normalize_text(text).split(" ")
    return {tuple(words[i : i + n]) for i in range(max(len(words) - n + 1, 1))}


def exact_jaccard(x: str, y: str) -> float:
    a, b = word_ngrams(x), word_ngrams(y)
    return len(a & b) / len(a | b)


TRICKY = [
    "",
    "one",
    "Two words",
    "exactly five words are here",
    "Ünïcödé — “quoted” café naïve, and then some more words follow here",
    "日本語 の テキスト 、 句読点 。 さらに 単語 が 続く",
    "snake_case_words and CamelCase\tand\nnew lines...   and spaces",
    " ".join(BASE),
    " ".join(EDITED),
]


def test_shingle_hashes_match_word_ngram_sets():
    """Vectorised shingling over a batch gives each document exactly its own word-5-gram set."""
    shingles = shingle_hashes(pa.array(TRICKY), 5)
    offsets = shingles.offsets.astype(np.int64)
    sets = [set(shingles.hashes[offsets[i] : offsets[i + 1]].tolist()) for i in range(len(TRICKY))]
    for i, text in enumerate(TRICKY):
        assert len(sets[i]) == len(word_ngrams(text)), text
        for j, other in enumerate(TRICKY):
            shared = len(sets[i] & sets[j]) / len(sets[i] | sets[j])
            assert shared == pytest.approx(exact_jaccard(text, other)), (text, other)


def test_exact_verification_reports_the_true_jaccard():
    config = CONFIG
    docs = {"a": ("web", " ".join(BASE)), "b": ("web", " ".join(EDITED))}
    signatures = compute_signatures(table(docs), config)
    assert signatures.schema.field("fingerprints").type == pa.list_(pa.uint32())
    clusters = find_duplicate_clusters(signatures, config, PRIORITY).to_pylist()
    assert clusters[1]["duplicate_of"] == "a"
    assert clusters[1]["jaccard"] == pytest.approx(exact_jaccard(docs["a"][1], docs["b"][1]))
    with pytest.raises(ValueError, match=r"lack columns \[.fingerprints.\]"):
        estimated = MinHashConfig(verification="estimated")
        find_duplicate_clusters(compute_signatures(table(docs), estimated), config, PRIORITY)


def test_a_cluster_spans_three_sources():
    docs = {
        "c1": ("code", " ".join(BASE)),
        "w1": ("web", " ".join(EDITED)),
        "r1": ("reference", " ".join(EDITED[:-1] + ["harbour"])),
        "w2": ("web", " ".join(random_document(7))),
    }
    clusters = find_duplicate_clusters(compute_signatures(table(docs), CONFIG), CONFIG, PRIORITY)
    got = {row["id"]: row for row in clusters.to_pylist()}
    assert {got[i]["cluster_id"] for i in ("c1", "w1", "r1")} == {"r1"} and got["w2"]["cluster_id"] == "w2"
    assert [i for i, row in got.items() if row["is_survivor"]] == ["r1", "w2"]
    report = duplicate_report(clusters)
    assert report.cluster_sizes == {3: 1}
    assert report.across == {("code", "reference"): 1, ("web", "reference"): 1}
    assert report.by_source["web"] == {
        "documents": 2,
        "exact": 0,
        "near": 1,
        "within_source": 0,
        "across_sources": 1,
    }


@settings(max_examples=25, deadline=None)
@given(
    text=st.text(max_size=300), sources=st.sampled_from([("web", "web"), ("web", "code"), ("code", "web")])
)
def test_identical_texts_always_cluster(text, sources):
    docs = {"x": (sources[0], text), "y": (sources[1], text), "z": ("reference", " ".join(BASE))}
    got = clusters_by_id(docs)
    assert got["x"]["cluster_id"] == got["y"]["cluster_id"]
    duplicate = got["y"] if got["x"]["is_survivor"] else got["x"]
    assert duplicate["match"] == "exact" and duplicate["jaccard"] == 1.0


def edited_pair(seed: int, replaced: int, words: int = 200) -> tuple[str, str, float]:
    """Two documents of distinct random words, the second with its last `replaced` words new.

    They share the word-5-grams before the replaced tail: Jaccard (196 - m) / (196 + m) for m replaced.
    """
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    fresh = list(dict.fromkeys("".join(rng.choices(letters, k=8)) for _ in range(2 * words)))
    first = fresh[:words]
    second = first[: words - replaced] + fresh[words : words + replaced]
    return " ".join(first), " ".join(second), (words - 4 - replaced) / (words - 4 + replaced)


@pytest.mark.parametrize(("replaced", "jaccard", "clustered"), [(10, 0.903, 100), (65, 0.502, 0)])
def test_hundred_seeded_pairs_at_jaccard_0_9_cluster_and_at_0_5_do_not(replaced, jaccard, clustered):
    """With the default config, 100 of 100 pairs at J = 0.90 clustered and 0 of 100 at J = 0.50."""
    docs = {}
    for trial in range(100):
        first, second, true_jaccard = edited_pair(trial, replaced)
        assert true_jaccard == pytest.approx(jaccard, abs=1e-3)
        assert exact_jaccard(first, second) == pytest.approx(true_jaccard)
        docs[f"{trial}a"], docs[f"{trial}b"] = ("web", first), ("web", second)
    got = clusters_by_id(docs)
    together = sum(got[f"{trial}a"]["cluster_id"] == got[f"{trial}b"]["cluster_id"] for trial in range(100))
    assert together == clustered
    assert sum(row["is_survivor"] for row in got.values()) == 200 - together  # no stray merges


def test_same_output_whatever_the_number_of_workers_or_batches():
    docs = {f"d{i:03d}": ("web" if i % 3 else "code", " ".join(random_document(i % 40))) for i in range(120)}
    documents = table(docs)
    whole = compute_signatures(documents, CONFIG)
    pieces = pa.concat_tables(compute_signatures(documents.slice(i, 7), CONFIG) for i in range(0, 120, 7))
    assert pieces.equals(whole)
    reference = find_duplicate_clusters(whole, CONFIG, PRIORITY, workers=1)
    assert reference.filter(pc.invert(reference["is_survivor"])).num_rows == 80
    for workers in (2, 5):
        assert find_duplicate_clusters(whole, CONFIG, PRIORITY, workers=workers).equals(reference)


def test_candidate_pairs_are_verified_in_bounded_batches_with_the_same_clusters(monkeypatch):
    """Verification streams the candidate pairs a few at a time and compares them in slices of bounded
    fingerprints: batches of 3 pairs, and slices of about one pair, give the clusters of one batch."""
    docs = {f"d{i:03d}": ("web", " ".join(random_document(i % 10))) for i in range(60)}
    signatures = compute_signatures(table(docs), CONFIG)
    reference = find_duplicate_clusters(signatures, CONFIG, PRIORITY)
    monkeypatch.setattr(dedup_clusters, "VERIFIED_PAIRS_PER_BATCH", 3)
    assert find_duplicate_clusters(signatures, CONFIG, PRIORITY).equals(reference)
    monkeypatch.setattr(dedup_clusters, "VALUES_PER_SLICE", 500)  # about one pair of 200 words
    assert find_duplicate_clusters(signatures, CONFIG, PRIORITY).equals(reference)


def fingerprint_lists(sizes: tuple[int, ...], seed: int) -> pa.Array:
    rng = np.random.default_rng(seed)
    return pa.array([rng.integers(0, 50, n).astype(np.uint32) for n in sizes], pa.list_(pa.uint32()))


def test_exact_jaccard_in_bounded_slices_equals_all_pairs_at_once(monkeypatch):
    x, y = fingerprint_lists((3, 40, 9, 0, 2, 70, 5), 0), fingerprint_lists((4, 1, 30, 6, 2, 2, 50), 1)
    whole = dedup_clusters.exact_jaccard(x, y)
    for limit in (1, 8, 60):
        monkeypatch.setattr(dedup_clusters, "VALUES_PER_SLICE", limit)
        assert dedup_clusters.exact_jaccard(x, y).tolist() == whole.tolist()


def test_similarity_by_index_equals_the_pairs_taken_whole(monkeypatch):
    """Lists named by many pairs (repeats, any order) give what the pairs' own copies give, in any slices
    (CONFIG verifies exactly)."""
    assert CONFIG.verification == "exact"
    x, y = fingerprint_lists((3, 40, 9, 0, 2), 2), fingerprint_lists((4, 1, 30, 6), 3)
    pairs = np.array([[1, 2], [1, 0], [4, 2], [0, 3], [1, 2], [3, 1], [2, 2], [1, 1]])
    whole = dedup_clusters.exact_jaccard(x.take(pairs[:, 0]), y.take(pairs[:, 1]))
    assert whole.min() < whole.max()
    for limit in (1, 8, 60, 10**6):
        monkeypatch.setattr(dedup_clusters, "VALUES_PER_SLICE", limit)
        assert dedup_clusters.similarity_by_index(x, y, pairs, CONFIG).tolist() == whole.tolist()
    assert dedup_clusters.similarity_by_index(x, y, pairs[:0], CONFIG).tolist() == []


def test_clusters_read_from_signature_files(tmp_path):
    docs = {"a": ("web", " ".join(BASE)), "b": ("code", " ".join(EDITED)), "c": ("code", "other text")}
    signatures = compute_signatures(table(docs), CONFIG)
    for source in ("web", "code"):
        (tmp_path / f"source={source}").mkdir()
        pq.write_table(
            signatures.filter(pc.equal(signatures["source"], source)),
            tmp_path / f"source={source}" / "part-0.parquet",
        )
    files = [str(tmp_path / "source=*" / "*.parquet")]
    assert signature_rows(files) == 3
    assert find_duplicate_clusters(files, CONFIG, PRIORITY).equals(
        find_duplicate_clusters(signatures, CONFIG, PRIORITY)
    )


def test_cluster_versions_change_only_with_decisions():
    docs = {"a": ("web", " ".join(BASE)), "b": ("code", " ".join(EDITED)), "c": ("code", "other text")}
    clusters = find_duplicate_clusters(compute_signatures(table(docs), CONFIG), CONFIG, PRIORITY)
    versions = cluster_versions(clusters)
    assert cluster_versions(clusters.take([2, 0, 1])) == versions  # row order does not matter
    split = clusters.to_pylist()
    split[1].update(cluster_id="b", is_survivor=True, duplicate_of=None, match=None)  # "b" now kept
    changed = cluster_versions(pa.Table.from_pylist(split, clusters.schema))
    assert changed["web"] == versions["web"] and changed["code"] != versions["code"]
    deduplicated = apply_dedup(table({"b": docs["b"], "c": docs["c"]}), clusters)
    assert built_from_version(deduplicated) == versions["code"]


def _pair_just_under_the_threshold() -> dict[str, tuple[str, str]]:
    """Two documents of 200 made-up words, the second with 5 of them replaced: exact word-5-gram
    Jaccard 0.774, which the default signature (seed 1) estimates at 0.804, sharing a band."""
    rng = random.Random(8)
    fresh = list(dict.fromkeys("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=7)) for _ in range(400)))
    first, second = fresh[:200], list(fresh[:200])
    for i, position in enumerate(rng.sample(range(200), rng.choice([4, 5]))):
        second[position] = fresh[200 + i]
    return {"a": ("web", " ".join(first)), "b": ("web", " ".join(second))}


def test_a_pair_under_the_threshold_is_not_merged_on_its_estimate():
    """Candidates are decided on the exact Jaccard of their shingle fingerprints: a pair at 0.774
    whose MinHash estimate passes 0.8 stays apart (with `verification: estimated` it merges)."""
    docs = _pair_just_under_the_threshold()
    assert exact_jaccard(docs["a"][1], docs["b"][1]) == pytest.approx(0.774, abs=0.001)
    estimated = MinHashConfig(verification="estimated")
    signatures = np.array(compute_signatures(table(docs), estimated)["signature"].to_pylist())
    same = signatures[0] == signatures[1]
    assert same.mean() >= 0.8 and same.reshape(14, 8).all(axis=1).any()  # a candidate, estimated over
    merged = find_duplicate_clusters(compute_signatures(table(docs), estimated), estimated, PRIORITY)
    assert merged["duplicate_of"].to_pylist() == [None, "a"]
    assert CONFIG.verification == "exact"
    clusters = find_duplicate_clusters(compute_signatures(table(docs), CONFIG), CONFIG, PRIORITY)
    assert clusters["is_survivor"].to_pylist() == [True, True]


def test_exact_jaccard_of_fingerprint_lists_is_set_jaccard():
    """Every pair at once, repeats within a list ignored, chunked or not."""
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for _ in range(200):
        x = rng.integers(0, 2**32, rng.integers(1, 40), dtype=np.uint64)
        y = np.concatenate([x[: rng.integers(0, len(x) + 1)], rng.integers(0, 2**32, rng.integers(1, 9))])
        xs.append(np.concatenate([x, x[:2]]).tolist())
        ys.append(rng.permutation(y).tolist())
    lists = pa.list_(pa.uint32())
    got = clusters.exact_jaccard(
        pa.array(xs, lists), pa.chunked_array([pa.array(ys[:50], lists), pa.array(ys[50:], lists)])
    )
    want = [len(set(x) & set(y)) / len(set(x) | set(y)) for x, y in zip(xs, ys, strict=True)]
    assert got.tolist() == pytest.approx(want)
    assert clusters.exact_jaccard(pa.array([], lists), pa.array([], lists)).tolist() == []
