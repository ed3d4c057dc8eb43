"""The tokenised mixture: the deficit-rule sampler, token shards and the files the trainer reads."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_dag.engine import run_stage
from moe_dag.mixture import (
    MixtureConfig,
    MixtureSampler,
    SourceTokens,
    TokenShard,
    build_mixture,
    pack_mixture,
    split_heldout,
    training_documents,
)
from moe_dag.mixture import build as mixture_build
from moe_dag.mixture.build import heldout_table
from moe_dag.mixture.curated import (
    TOKENS_STAGE,
    build_curated_mixture,
    read_heldout_cuts,
    train_curated_tokenizer,
)
from moe_dag.mixture.heldout import heldout_count, heldout_cut, split_at_cut
from moe_dag.mixture.neutral import EXCLUSION_SCHEMA, EXCLUSIONS_STAGE, without_excluded
from moe_dag.mixture.token_shards import token_dtype, write_token_shard
from moe_dag.mixture.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer
from moe_dag.mixture.unfiltered import build_unfiltered_mixture, removal_reasons, unfiltered_documents
from moe_dag.operations.bounds import untrained_sources
from moe_dag.storage.lake import Lake

# ---------------------------------------------------------------------------------------------- sampler


def random_lengths(
    seed: int, sizes: dict[str, int], longest: int = 300, bimodal: bool = False
) -> dict[str, np.ndarray]:
    """Lengths uniform in [1, longest), or (bimodal) only 1 or longest: the hardest case to balance."""
    rng = np.random.default_rng(seed)
    if bimodal:
        return {source: rng.choice([1, longest], size=n) for source, n in sizes.items()}
    return {source: rng.integers(1, longest, size=n) for source, n in sizes.items()}


def drawn_tokens_per_prefix(sampler, lengths, draws: int) -> tuple[np.ndarray, list[str]]:
    """[draws, sources] cumulative tokens per source after each draw."""
    sources = sampler.sources
    steps = np.zeros((draws, len(sources)), dtype=np.int64)
    for step, (source, document) in zip(range(draws), sampler, strict=False):
        steps[step, sources.index(source)] = lengths[source][document]
    return np.cumsum(steps, axis=0), sources


@settings(max_examples=25, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 10.0), min_size=2, max_size=6),
    seed=st.integers(0, 2**32),
    longest=st.integers(2, 2000),
    bimodal=st.booleans(),
)
def test_every_prefix_is_within_one_document_of_target(weights, seed, longest, bimodal):
    sources = {f"s{i}": 50 for i in range(len(weights))}
    lengths = random_lengths(seed, sources, longest, bimodal)
    weight_of = dict(zip(sources, weights, strict=True))
    # Epoch cap high enough that no source stops within the draws checked.
    sampler = MixtureSampler(lengths, weight_of, seed=seed, max_epochs=1000.0)
    cumulative, order = drawn_tokens_per_prefix(sampler, lengths, 2000)
    shares = np.array([sampler.target_shares[s] for s in order])
    deviation = np.abs(cumulative - shares * cumulative.sum(axis=1, keepdims=True))
    assert deviation.max() <= max(int(lengths[s].max()) for s in order)


def test_same_seed_same_stream_and_each_epoch_is_a_fresh_permutation():
    lengths = random_lengths(0, {"a": 40, "b": 25})
    weights = {"a": 2.0, "b": 1.0}
    first = [*MixtureSampler(lengths, weights, seed=7, max_epochs=3.0)]
    again = [*MixtureSampler(lengths, weights, seed=7, max_epochs=3.0)]
    other = [*MixtureSampler(lengths, weights, seed=8, max_epochs=3.0)]
    assert first == again
    assert first != other
    for source, n in (("a", 40), ("b", 25)):
        order = [document for s, document in first if s == source]
        epochs = [order[e * n : (e + 1) * n] for e in range(3)]
        assert all(sorted(epoch) == list(range(n)) for epoch in epochs)
        assert epochs[0] != epochs[1] != epochs[2]


def test_resume_from_state_dict_continues_exactly():
    lengths = random_lengths(1, {"cc": 300, "code": 120, "math": 40})
    weights = {"cc": 5.0, "code": 3.0, "math": 2.0}
    uninterrupted = MixtureSampler(lengths, weights, seed=3, max_epochs=20.0)
    expected = [next(uninterrupted) for _ in range(2000)][1000:]

    interrupted = MixtureSampler(lengths, weights, seed=3, max_epochs=20.0)
    for _ in range(1000):
        next(interrupted)
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert len(json.dumps(state)) < 500  # counters, not permutations
    resumed = MixtureSampler(lengths, weights, seed=3, max_epochs=20.0)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(1000)] == expected


def test_a_capped_source_stops_and_the_others_keep_their_ratio():
    lengths = {"big": np.full(1000, 10), "mid": np.full(1000, 10), "tiny": np.full(5, 10)}
    sampler = MixtureSampler(lengths, {"big": 2.0, "mid": 1.0, "tiny": 1.0}, seed=0, max_epochs=2.5)
    for _ in range(600):
        next(sampler)
    assert sampler.exhausted == ["tiny"]
    assert sampler.documents_drawn["tiny"] == 12  # floor(2.5 * 5)
    assert sampler.epochs["tiny"] == pytest.approx(2.4)
    assert sampler.documents_drawn["big"] == pytest.approx(2 * sampler.documents_drawn["mid"], abs=1)
    assert sampler.tokens_drawn["tiny"] / sum(sampler.tokens_drawn.values()) < 0.25
    drawn = 600 + sum(1 for _ in sampler)
    assert drawn == 2500 + 2500 + 12  # every source ends at its cap, then the sampler stops
    assert sampler.exhausted == ["big", "mid", "tiny"]


@pytest.mark.parametrize(
    ("weights", "lengths", "message"),
    [
        ({"a": 1.0, "zzz": 1.0}, {"a": [3]}, "unknown source 'zzz'"),
        ({"a": 0.0}, {"a": [3]}, "must be positive"),
        ({"a": -1.0}, {"a": [3]}, "must be positive"),
        ({"a": float("nan")}, {"a": [3]}, "must be positive"),
        ({"a": 1.0}, {"a": [3], "b": [3]}, r"\['b'\] have documents but no mixture weight"),
        ({}, {"a": [3]}, "empty"),
        ({"a": 1.0}, {"a": []}, "no documents"),
        ({"a": 1.0}, {"a": [3, 0]}, "document of 0 tokens"),
        ({"a": 1.0}, {"a": [3, 3, 3]}, "lets source 'a' \\(3 documents\\) draw none"),
    ],
)
def test_invalid_mixtures_raise(weights, lengths, message):
    with pytest.raises(ValueError, match=message):
        MixtureSampler({k: np.array(v) for k, v in lengths.items()}, weights, seed=0, max_epochs=0.3)


def test_state_of_another_sampler_is_refused():
    lengths = random_lengths(0, {"a": 10})
    state = MixtureSampler(lengths, {"a": 1.0}, seed=1, max_epochs=1.0).state_dict()
    with pytest.raises(ValueError, match="seed"):
        MixtureSampler(lengths, {"a": 1.0}, seed=2, max_epochs=1.0).load_state_dict(state)
    state["sources"]["a"]["documents"] = 11
    with pytest.raises(ValueError, match="does not fit"):
        MixtureSampler(lengths, {"a": 1.0}, seed=1, max_epochs=1.0).load_state_dict(state)


# ------------------------------------------------------------------------------------------------ build

WORDS = ["the", "of", "data", "model", "token", "expert", "grüße", "数据", "λ", "def", "return", "(", ")"]
SEQ_LEN = 32


def synthetic_documents(source: str, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(5, 120))) + "\n" for _ in range(n)]
    return pa.table({"id": [f"{source}-{i}" for i in range(n)], "text": texts, "source": [source] * n})


@pytest.fixture(scope="module")
def corpus():
    documents = {
        "cc": synthetic_documents("cc", 150, 0),
        "code": synthetic_documents("code", 80, 1),
        "math": synthetic_documents("math", 30, 2),
    }
    texts = (text for table in documents.values() for text in table["text"].to_pylist())
    return documents, train_tokenizer(texts, TokenizerConfig(vocab_size=300))


CONFIG = MixtureConfig(
    weights={"cc": 0.5, "code": 0.3, "math": 0.2},
    seq_len=SEQ_LEN,
    heldout_fraction=0.1,
    heldout_min_documents=5,
)


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    documents, tokenizer = corpus
    out_dir = tmp_path_factory.mktemp("mixture")
    return build_mixture(documents, tokenizer, CONFIG, out_dir), out_dir


def test_token_shard_round_trips_documents_and_allows_an_empty_source(corpus, tmp_path):
    documents, tokenizer = corpus
    table = documents["math"].slice(0, 3)
    shard = write_token_shard(table, tokenizer, 0, tmp_path, "math")
    reopened = TokenShard.open(tmp_path, "math")
    assert len(reopened) == 3 and reopened.ids.to_pylist() == table["id"].to_pylist()
    assert isinstance(reopened.tokens, np.memmap)
    for i, text in enumerate(table["text"].to_pylist()):
        document = reopened.document(i)
        assert document[-1] == 0 and tokenizer.decode(document[:-1].tolist()) == text
        assert reopened.num_bytes[i] == len(text.encode("utf-8"))
    np.testing.assert_array_equal(reopened.lengths, shard.lengths)
    empty = write_token_shard(table.slice(0, 0), tokenizer, 0, tmp_path, "none")
    assert len(empty) == 0 and len(empty.tokens) == 0


def test_files_have_the_documented_shapes_and_dtypes(built, corpus):
    report, out_dir = built
    train = np.load(out_dir / "train.npy", mmap_mode="r")
    assert train.dtype == np.uint16 and report["dtype"] == "uint16"
    assert token_dtype(2**16) == np.uint16 and token_dtype(2**16 + 1) == np.uint32
    assert train.shape == (report["num_sequences"], SEQ_LEN + 1)
    assert report["total_tokens"] == train.size
    assert int(train.max()) < report["vocab_size"]
    assert json.loads((out_dir / "mixture.json").read_text()) == report
    heldout = pq.read_table(out_dir / "heldout.parquet")
    assert heldout.schema.names == ["source", "id", "tokens", "num_bytes"]
    assert heldout.schema.field("tokens").type == pa.list_(pa.int32())
    documents, tokenizer = corpus
    texts = {
        i: t
        for table in documents.values()
        for i, t in zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True)
    }
    for row in heldout.to_pylist():
        assert row["tokens"][-1] == report["eos_id"]
        assert tokenizer.decode(row["tokens"][:-1]) == texts[row["id"]]
        assert row["num_bytes"] == len(texts[row["id"]].encode("utf-8"))


def test_train_rows_are_the_sampled_documents_back_to_back(built):
    report, out_dir = built
    shards = {source: TokenShard.open(out_dir / "shards", source) for source in report["sources"]}
    sampler = MixtureSampler(
        {s: shard.lengths for s, shard in shards.items()},
        CONFIG.weights,
        seed=CONFIG.seed,
        max_epochs=CONFIG.max_epochs,
    )
    draws = list(sampler)
    stream = np.concatenate([shards[source].document(document) for source, document in draws])
    flat = np.load(out_dir / "train.npy").reshape(-1)
    np.testing.assert_array_equal(flat, stream[: len(flat)])
    # The index-level plan: the draws up to the first cap, as (column in source_columns, document).
    plan = np.load(out_dir / "train_plan.npy")
    drawn = sum(report["sources"][source]["documents"] for source in shards)
    assert plan.dtype == np.int64 and plan.shape == (drawn, 2)
    assert [(report["source_columns"][c], d) for c, d in plan.tolist()] == draws[: len(plan)]
    assert sum(shards[s].lengths[d] for s, d in draws[: len(plan)]) >= len(flat)


def test_heldout_is_disjoint_from_training_and_seed_independent(built, corpus, tmp_path):
    report, out_dir = built
    heldout_ids = set(pq.read_table(out_dir / "heldout.parquet")["id"].to_pylist())
    train_ids = {i for s in report["sources"] for i in TokenShard.open(out_dir / "shards", s).ids.to_pylist()}
    assert heldout_ids and not heldout_ids & train_ids
    documents, tokenizer = corpus
    assert len(heldout_ids) + len(train_ids) == sum(table.num_rows for table in documents.values())
    reseeded = replace(CONFIG, seed=5)
    build_mixture(documents, tokenizer, reseeded, tmp_path)
    assert set(pq.read_table(tmp_path / "heldout.parquet")["id"].to_pylist()) == heldout_ids


def test_without_a_budget_the_shares_hold_until_the_first_cap(built):
    report, out_dir = built
    longest = max(int(TokenShard.open(out_dir / "shards", s).lengths.max()) for s in report["sources"])
    for source, row in report["sources"].items():
        assert abs(row["achieved_share"] - row["target_share"]) <= longest / report["total_tokens"], source
        assert not row["short"]
    assert [s for s, row in report["sources"].items() if row["capped"]] == ["math"]
    assert report["sources"]["math"]["epochs"] == CONFIG.max_epochs
    assert report["warnings"] == []


def test_a_budget_sets_the_row_count_and_a_too_large_one_reports_the_shortfall(corpus, tmp_path):
    documents, tokenizer = corpus
    small = build_mixture(documents, tokenizer, replace(CONFIG, total_tokens=1000), tmp_path / "a")
    assert small["num_sequences"] == 1000 // (SEQ_LEN + 1)
    assert np.load(tmp_path / "a" / "train.npy").shape == (30, SEQ_LEN + 1)
    huge = build_mixture(documents, tokenizer, replace(CONFIG, total_tokens=10**6), tmp_path / "b")
    assert all(row["capped"] for row in huge["sources"].values())
    assert huge["sources"]["math"]["short"]
    assert huge["sources"]["math"]["achieved_share"] < 0.2
    # The shortfall is the asset check sources_within_epoch_cap's (tests/test_check_messages.py).
    assert any("every source hit its epoch cap" in warning for warning in huge["warnings"])


def test_rebuilding_gives_byte_identical_files(built, corpus, tmp_path):
    _, out_dir = built
    documents, tokenizer = corpus
    build_mixture(documents, tokenizer, CONFIG, tmp_path)
    names = sorted(p.relative_to(out_dir) for p in out_dir.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    for name in names:
        assert (out_dir / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_user_errors_raise_value_error(corpus, tmp_path):
    documents, tokenizer = corpus
    with pytest.raises(ValueError, match="unknown source 'web'"):
        build_mixture(documents, tokenizer, MixtureConfig(weights={**CONFIG.weights, "web": 1.0}), tmp_path)
    with pytest.raises(ValueError, match=r"\['code'\] have documents but no mixture weight"):
        build_mixture(documents, tokenizer, MixtureConfig(weights={"cc": 1.0, "math": 1.0}), tmp_path)
    with pytest.raises(ValueError, match="heldout_fraction"):
        build_mixture(documents, tokenizer, replace(CONFIG, heldout_fraction=1.0), tmp_path)
    with pytest.raises(ValueError, match="total_tokens"):
        build_mixture(documents, tokenizer, replace(CONFIG, total_tokens=SEQ_LEN), tmp_path)
    tiny = {source: table.slice(0, 1) for source, table in documents.items()}
    with pytest.raises(ValueError, match="less than one sequence"):
        build_mixture(
            tiny,
            tokenizer,
            replace(CONFIG, seq_len=4096, heldout_fraction=0.0, heldout_min_documents=0),
            tmp_path / "tiny",
        )
    without_text = {**documents, "cc": documents["cc"].drop_columns("text")}
    with pytest.raises(ValueError, match="source 'cc' have no 'text' column"):
        build_mixture(without_text, tokenizer, CONFIG, tmp_path)
    assert not (tmp_path / "shards").exists()  # every check above ran before any tokenisation


def test_token_shards_per_input_shard_pack_the_same_mixture(corpus, built, tmp_path):
    """The engine tokenises each input shard alone; end to end they must give the files one shard gives."""
    documents, tokenizer = corpus
    _, one_shard_dir = built
    eos = tokenizer.token_to_id(CONFIG.eos_token)
    sources, heldout = {}, []
    for source in sorted(documents):
        # Each half is split on its own against the source's cut, as the engine splits each shard.
        cut = heldout_cut(
            documents[source]["id"].to_pylist(), CONFIG.heldout_fraction, CONFIG.heldout_min_documents
        )
        table = documents[source]
        halves = [table.slice(0, table.num_rows // 2), table.slice(table.num_rows // 2)]
        splits = [split_at_cut(half, cut) for half in halves]
        train = pa.concat_tables([t for t, _ in splits])
        held = pa.concat_tables([h for _, h in splits])
        halves = [train.slice(0, train.num_rows // 2), train.slice(train.num_rows // 2)]
        shards = [
            write_token_shard(half, tokenizer, eos, tmp_path / "shards", f"{source}-{i}")
            for i, half in enumerate(halves)
        ]
        sources[source] = SourceTokens(source, shards)
        heldout.append(heldout_table(held, tokenizer, eos, source))
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    pack_mixture(sources, pa.concat_tables(heldout), vocab_size, eos, CONFIG, tmp_path)
    for name in ("train.npy", "heldout.parquet", "mixture.json"):
        assert (tmp_path / name).read_bytes() == (one_shard_dir / name).read_bytes(), name


def test_every_prefix_of_rows_keeps_the_shares_and_the_row_counts_say_so(built):
    """Rows in file order are a prefix of the sampler's stream: after any number of rows each source is
    within two documents of its target (one from the sampler, one from the cut inside a document)."""
    report, out_dir = built
    shards = {source: TokenShard.open(out_dir / "shards", source) for source in report["source_columns"]}
    counts = np.load(out_dir / "train_source_tokens.npy")
    assert counts.shape == (report["num_sequences"], 3) and counts.dtype == np.int32
    assert (counts.sum(axis=1) == SEQ_LEN + 1).all()
    sampler = MixtureSampler(
        {s: shard.lengths for s, shard in shards.items()}, CONFIG.weights, seed=CONFIG.seed, max_epochs=4.0
    )
    column_of = {source: i for i, source in enumerate(report["source_columns"])}
    stream_sources = np.concatenate([np.full(shards[s].lengths[d], column_of[s]) for s, d in sampler])
    rows = stream_sources[: len(counts) * (SEQ_LEN + 1)].reshape(len(counts), SEQ_LEN + 1)
    for column in range(3):
        np.testing.assert_array_equal(counts[:, column], (rows == column).sum(axis=1))

    longest = max(int(shard.lengths.max()) for shard in shards.values())
    targets = np.array([sampler.target_shares[source] for source in report["source_columns"]])
    seen = np.cumsum(counts, axis=0)
    deficits = seen - seen.sum(axis=1, keepdims=True) * targets
    assert np.abs(deficits).max() <= 2 * longest


@pytest.mark.parametrize(
    ("documents", "fraction", "minimum", "expected"),
    [
        (1000, 0.05, 50, 50),
        (2000, 0.05, 50, 100),
        # A small source gives at most half of its documents to evaluation (issue 20: all of them before).
        (30, 0.05, 50, 15),
        (50, 0.05, 50, 25),
        (101, 0.05, 50, 50),
        (1, 0.05, 50, 0),
        (200, 0.0, 0, 0),
    ],
)
def test_heldout_takes_the_minimum_per_source_and_at_most_half(documents, fraction, minimum, expected):
    assert heldout_count(documents, fraction, minimum) == expected
    table = pa.table({"id": [f"d{i}" for i in range(documents)], "text": ["x"] * documents})
    train, held = split_heldout(table, fraction, minimum)
    assert held.num_rows == expected and train.num_rows == documents - expected
    assert set(train["id"].to_pylist()).isdisjoint(held["id"].to_pylist())
    shuffled = table.take(np.random.default_rng(0).permutation(documents))
    assert sorted(split_heldout(shuffled, fraction, minimum)[1]["id"].to_pylist()) == sorted(
        held["id"].to_pylist()
    )


def test_heldout_share_cap_comes_from_config():
    assert heldout_count(30, 0.05, 50, max_share=1.0) == 30  # the former rule: held out whole
    assert heldout_count(30, 0.05, 50, max_share=0.2) == 6
    with pytest.raises(ValueError, match="heldout_max_share"):
        MixtureConfig(weights={"a": 1.0}, heldout_max_share=0.0)


def test_a_source_smaller_than_the_minimum_still_trains(corpus, tmp_path):
    """Defect from issue 20: a source of 50 or fewer documents went whole to the held-out set and got
    no training tokens, its mixture weight silently moved to the other sources."""
    documents, tokenizer = corpus
    report = build_mixture(documents, tokenizer, replace(CONFIG, heldout_min_documents=50), tmp_path)
    heldout = pq.read_table(tmp_path / "heldout.parquet")
    per_source = {s: heldout["source"].to_pylist().count(s) for s in ("cc", "code", "math")}
    assert per_source == {"cc": 50, "code": 40, "math": 15}  # code has 80 documents, math 30
    math = report["sources"]["math"]
    assert math["trained"] and math["tokens"] > 0 and math["train_documents"] == 15
    assert untrained_sources(report["sources"], CONFIG.weights) == []
    held_whole = replace(CONFIG, heldout_min_documents=50, heldout_max_share=1.0)
    report = build_mixture(documents, tokenizer, held_whole, tmp_path / "whole")
    assert not report["sources"]["math"]["trained"]
    (problem,) = untrained_sources(report["sources"], CONFIG.weights)
    assert "'math'" in problem and "no training tokens" in problem and "heldout_max_share" in problem


# ------------------------------------------------------------------------------------- from the lake


@pytest.fixture
def scored_lake(corpus, tmp_path):
    """The corpus as scored_documents in a lake: two shards per source, every seventh document dropped,
    and a few kept ones excluded as the neutral set's copies."""
    documents, _ = corpus
    lake = Lake(tmp_path / "lake")
    excluded = []
    for source, table in documents.items():
        keep = [i % 7 != 3 for i in range(table.num_rows)]
        scored = table.append_column("keep", pa.array(keep)).append_column(
            "reason", pa.array([None if k else "too_short" for k in keep], pa.string())
        )
        half = scored.num_rows // 2
        for key, part in (("s0", scored.slice(0, half)), ("s1", scored.slice(half))):
            lake.write_file(part, lake.shard_path("scored_documents", source, key))
            lake.write_record("scored_documents", source, key, {"digest": f"{source}-{key}"})
        excluded += [(source, doc_id, "near_copy") for doc_id in table["id"].to_pylist()[5:8]]
    rows = {name: [row[i] for row in excluded] for i, name in enumerate(EXCLUSION_SCHEMA.names)}
    lake.write_table(pa.table(rows, EXCLUSION_SCHEMA), EXCLUSIONS_STAGE)
    usable = {
        source: without_excluded(
            table.filter(pa.array([i % 7 != 3 for i in range(table.num_rows)])),
            {doc_id for _, doc_id, _ in excluded},
        )
        for source, table in documents.items()
    }
    return lake, usable


@pytest.mark.parametrize("on_ray", [False, True])
def test_the_library_builds_from_the_lake_what_build_mixture_builds_in_memory(
    scored_lake, tmp_path, request, on_ray
):
    """Without Dagster: the tokenizer's passes over the kept ids and text, the token indexes, the held-out
    file and the packing all run as tasks (Ray tasks, or the same functions here without Ray), never as
    reads of the lake's slices here; the files are those `build_mixture` writes for the same documents and
    tokenizer, byte for byte."""
    if on_ray:
        request.getfixturevalue("local_ray")
    lake, usable = scored_lake
    sources = ["math", "cc", "code"]
    scans = Counter()
    iter_batches = lake.iter_batches

    def counting(stage, source=None, columns=None, **kwargs):
        scans[(stage, source)] += 1
        return iter_batches(stage, source, columns=columns, **kwargs)

    lake.iter_batches = counting
    trained = train_curated_tokenizer(lake, sources, CONFIG, TokenizerConfig(vocab_size=300))
    assert not scans

    report, out_dir = build_curated_mixture(
        lake, sources, CONFIG, lambda spec, source, inputs: run_stage(spec, lake, source, inputs, workers=0)
    )
    assert not scans
    assert len(lake.records(TOKENS_STAGE, "cc")) == 2  # one token shard per scored shard

    training = training_documents(
        usable, CONFIG.heldout_fraction, CONFIG.heldout_min_documents, CONFIG.heldout_max_share
    )
    assert trained.documents == sum(table.num_rows for table in training.values())
    in_memory = train_tokenizer(
        (text for s in sources for text in training[s]["text"].to_pylist()), TokenizerConfig(vocab_size=300)
    )
    assert trained.tokenizer.to_str() == in_memory.to_str()
    expected = build_mixture(usable, trained.tokenizer, CONFIG, tmp_path / "in_memory")
    assert report == expected
    for name in ("train.npy", "train_source_tokens.npy", "heldout.parquet", "mixture.json"):
        assert (out_dir / name).read_bytes() == (tmp_path / "in_memory" / name).read_bytes(), name


def test_the_mixture_uses_the_cuts_the_tokenizer_was_trained_around(scored_lake):
    lake, _ = scored_lake
    with pytest.raises(ValueError, match="materialise the tokenizer"):
        read_heldout_cuts(lake, ["cc"])
    trained = train_curated_tokenizer(lake, ["cc", "code"], CONFIG, TokenizerConfig(vocab_size=300))
    assert read_heldout_cuts(lake, ["cc", "code"]) == trained.cuts
    with pytest.raises(ValueError, match=r"predates sources \['math'\]"):
        read_heldout_cuts(lake, ["cc", "math"])


def test_an_ablation_leaves_out_the_ids_it_drops_and_still_says_which_are_evaluation_copies():
    """benchmarks/curation_gain.py --ablate packs the unfiltered path less what the other curation stages
    dropped: those ids go (reason `dropped`), and an evaluation copy keeps its own reason."""
    table = pa.table({"id": ["held", "near", "gone", "kept"], "text": ["a", "b", "c", "d"]})
    reasons = removal_reasons(
        table, frozenset({"held"}), frozenset(), frozenset({"near"}), frozenset({"held", "near", "gone"})
    )
    assert reasons == ["heldout", "near_copy", "dropped", None]


def test_the_unfiltered_mixture_is_built_per_shard_without_raw_text_in_this_process(
    corpus, tmp_path, local_ray
):
    """The unfiltered baseline from the lake: raw shards hashed and tokenised in Ray tasks, the driver
    reading no raw document; the same files `build_mixture` writes from `unfiltered_documents` in memory."""
    documents, tokenizer = corpus
    lake = Lake(tmp_path / "lake")
    cc_text = documents["cc"]["text"][0].as_py()
    raw = {source: table.select(["id", "text", "source"]) for source, table in documents.items()}
    copy = pa.table({"id": ["code-copy"], "text": [cc_text], "source": ["code"]})  # an exact copy of cc-0
    raw["code"] = pa.concat_tables([raw["code"], copy])
    for source, table in raw.items():
        half = table.num_rows // 2
        for key, part in (("a", table.slice(0, half)), ("b", table.slice(half))):
            lake.write_file(part, lake.shard_path("raw_documents", source, key))
            lake.write_record("raw_documents", source, key, {"digest": f"{source}-{key}"})
    clusters = pa.table(
        {"id": ["cc-1", "cc-9", "math-7", "code-3"], "cluster_id": ["cc-1", "cc-1", "cc-1", "code-3"]}
    )
    lake.write_table(clusters, "dedup_clusters")
    exclusions = pa.table({"source": ["code"], "id": ["code-5"], "reason": ["neutral"]}, EXCLUSION_SCHEMA)
    lake.write_table(exclusions, EXCLUSIONS_STAGE)
    save_tokenizer(tokenizer, lake.artifact_dir("tokenizer"))
    curated = lake.artifact_dir("tokenized_mixture")
    held = heldout_table(raw["cc"].slice(0, 2), tokenizer, 0, "cc")  # cc-0 and cc-1
    pq.write_table(held, curated / "heldout.parquet")
    (curated / "mixture.json").write_text(json.dumps({"total_tokens": 1980}))

    reads = Counter()
    for method in ("iter_batches", "read_table"):
        original = getattr(lake, method)

        def counting(stage, *args, _original=original, **kwargs):
            reads[stage] += 1
            return _original(stage, *args, **kwargs)

        setattr(lake, method, counting)
    specs = []

    def run(spec, s, inputs):
        specs.append(spec)
        return run_stage(spec, lake, s, inputs, workers=0)

    built = build_unfiltered_mixture(lake, ["cc", "code", "math"], CONFIG, run)
    assert reads["raw_documents"] == 0
    # One tokenizer per worker process: one loaded per shard left a few MB a shard behind in the worker.
    assert [spec.warm for spec in specs if "unfiltered_mixture/shards" in spec.outputs] == [True] * 3
    assert len(lake.records("unfiltered_mixture/shards", "code")) == 2

    kept, removed = unfiltered_documents(raw, {"cc-0", "cc-1", "code-5"}, clusters)
    assert removed == {"heldout": 3, "exact_copy": 1, "near_copy": 2} == built.removed
    assert built.documents == sum(table.num_rows for table in kept.values())
    recipe = replace(CONFIG, total_tokens=1980, heldout_fraction=0.0, heldout_min_documents=0)
    assert build_mixture(kept, tokenizer, recipe, tmp_path / "in_memory") == built.report
    for name in ("train.npy", "train_source_tokens.npy", "heldout.parquet", "mixture.json"):
        assert (built.out_dir / name).read_bytes() == (tmp_path / "in_memory" / name).read_bytes(), name


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 7])
def test_packing_in_chunks_writes_the_same_rows(corpus, built, tmp_path, monkeypatch, rows_per_chunk):
    """Chunks pack in parallel from the plan alone; documents cross chunk boundaries."""
    documents, tokenizer = corpus
    _, whole = built
    monkeypatch.setattr(mixture_build, "PACK_CHUNK_TOKENS", rows_per_chunk * (SEQ_LEN + 1))
    build_mixture(documents, tokenizer, CONFIG, tmp_path)
    for name in ("train.npy", "train_source_tokens.npy", "train_plan.npy", "mixture.json"):
        assert (tmp_path / name).read_bytes() == (whole / name).read_bytes(), name
