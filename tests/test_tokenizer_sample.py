"""The tokenizer learns from a bounded sample once the corpus outgrows `max_training_documents` (issue 19:
its trainer runs in the driver, whose memory grew with the corpus): drawn on the id hash by the tasks
that read the text, the same share of every source, the same whatever the files; a corpus within the
bound trains on every training document, as before."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from moe_dag.mixture import MixtureConfig
from moe_dag.mixture.curated import heldout_cuts, sample_tops, train_curated_tokenizer
from moe_dag.mixture.heldout import split_at_cut
from moe_dag.mixture.neutral import Exclusions
from moe_dag.mixture.sampler import stable_hash
from moe_dag.mixture.tokenizer import TokenizerConfig, train_tokenizer
from moe_dag.storage.lake import Lake

CONFIG = MixtureConfig(
    weights={"web": 0.6, "code": 0.4}, seq_len=32, heldout_fraction=0.1, heldout_min_documents=5
)
SIZES = {"web": 400, "code": 200}
WORDS = ["river", "mill", "town", "def", "return", "import", "value", "the", "of", "lambda", "self"]


def _documents(source: str, n: int) -> pa.Table:
    rng = random.Random(source)
    texts = [" ".join(rng.choice(WORDS) + str(rng.randint(0, 50)) for _ in range(30)) for _ in range(n)]
    return pa.table(
        {
            "id": [f"{source}/{i}" for i in range(n)],
            "text": texts,
            "keep": [i % 9 != 4 for i in range(n)],
            "reason": pa.array([None if i % 9 != 4 else "x" for i in range(n)], pa.string()),
        }
    )


def _lake(folder, files: int) -> Lake:
    """The sources' scored documents in `files` files a source."""
    lake = Lake(folder)
    for source, n in SIZES.items():
        table = _documents(source, n)
        for f in range(files):
            part = table.slice(n * f // files, n * (f + 1) // files - n * f // files)
            lake.write_file(part, lake.shard_path("scored_documents", source, f"s{f}"))
    return lake


def _sampled(lake: Lake, cuts: dict, tops: dict, sources=tuple(SIZES)) -> list[str]:
    """The texts the sample should hold, in the sources' and files' order, read here."""
    texts = []
    for source in sources:
        for path in lake.parquet_files("scored_documents", source):
            table = lake.read_file(path)
            training = split_at_cut(table.filter(table["keep"]), cuts[source])[0]
            texts += [
                text
                for doc_id, text in zip(training["id"].to_pylist(), training["text"].to_pylist(), strict=True)
                if tops[source] is None or stable_hash(doc_id) <= tops[source]
            ]
    return texts


def test_within_the_bound_every_training_document_is_learnt_from():
    assert sample_tops({"a": 5, "b": None}, {"a": 10, "b": 20}, 30) == {"a": None, "b": None}


def test_past_the_bound_each_source_gives_the_same_share_of_its_training_hashes():
    cut = 1 << 60
    tops = sample_tops({"a": cut, "b": None}, {"a": 300, "b": 100}, 100)
    assert tops["a"] - cut == pytest.approx(0.25 * ((1 << 64) - 1 - cut), rel=1e-9)
    assert tops["b"] == pytest.approx(0.25 * (1 << 64), rel=1e-9)


@pytest.mark.parametrize("on_ray", [False, True])
def test_the_sample_is_drawn_by_hash_in_tasks_and_the_tokenizer_learns_from_it_alone(
    tmp_path, request, on_ray
):
    if on_ray:
        request.getfixturevalue("local_ray")
    lake = _lake(tmp_path / "three", files=3)
    cuts, training = heldout_cuts(lake, list(SIZES), CONFIG, Exclusions(lake.url))
    config = TokenizerConfig(vocab_size=300, max_training_documents=sum(training.values()) // 3)
    trained = train_curated_tokenizer(lake, list(SIZES), CONFIG, config)
    tops = sample_tops(cuts, training, config.max_training_documents)
    texts = _sampled(lake, cuts, tops)
    assert trained.available == sum(training.values()) and trained.documents == len(texts)
    # A uniform sample: about the bound in all (binomial spread), each source about a third of its own.
    assert abs(len(texts) - config.max_training_documents) < 4 * config.max_training_documents**0.5
    for source in SIZES:
        drawn = len(_sampled(lake, cuts, tops, [source]))
        assert abs(drawn - training[source] / 3) < 4 * (training[source] / 3) ** 0.5, source
    assert trained.tokenizer.to_str() == train_tokenizer(texts, config).to_str()

    # The same documents however the rows lie in files (the order of training follows the files).
    one_file = _lake(tmp_path / "one", files=1)
    again = train_curated_tokenizer(one_file, list(SIZES), CONFIG, config)
    assert again.documents == trained.documents and again.cuts == trained.cuts
    assert sorted(_sampled(one_file, cuts, tops)) == sorted(texts)


def test_a_corpus_within_the_bound_trains_on_all_of_it(tmp_path):
    lake = _lake(tmp_path / "lake", files=2)
    trained = train_curated_tokenizer(lake, list(SIZES), CONFIG, TokenizerConfig(vocab_size=300))
    assert trained.documents == trained.available
    cuts, _ = heldout_cuts(lake, list(SIZES), CONFIG, Exclusions(lake.url))
    texts = _sampled(lake, cuts, dict.fromkeys(SIZES))
    assert trained.tokenizer.to_str() == train_tokenizer(texts, TokenizerConfig(vocab_size=300)).to_str()


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="max_training_documents"):
        TokenizerConfig(max_training_documents=0)
