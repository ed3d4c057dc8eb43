"""The byte-level BPE tokenizer: exact round trips on any text, special-token ids, save and load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from moe_dag.mixture.tokenizer import (
    TokenizerConfig,
    eos_id,
    load_pretrained_tokenizer,
    load_tokenizer,
    remember_more_words,
    save_tokenizer,
    train_tokenizer,
)

CODE = 'def mean(xs: list[float]) -> float:\n\t"""Average."""\r\n    return sum(xs) / max(len(xs), 1)  # ok\n'
PROSE = 'The quick brown fox jumps over the lazy dog.  Twice, it said: "no" -- then left...\n\n'
NON_ENGLISH = "Grüße aus Köln! Привет, мир. 你好，世界。 مرحبا بالعالم. नमस्ते 🙂👍🏽 e\u0301 \u00a0\u200b"
TRAINING_TEXTS = [CODE * 3, PROSE * 3, NON_ENGLISH * 3]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TRAINING_TEXTS, TokenizerConfig(vocab_size=400))


@pytest.mark.parametrize(
    "text",
    [
        CODE,
        PROSE,
        NON_ENGLISH,
        # Text unlike anything in training still round-trips: every byte has a symbol.
        "ሰላም ዓለም ᚠᛇᚻ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \x00\x7f\ufeff",
        "   leading and trailing spaces   \n\n\n",
        "",
    ],
)
def test_round_trip_is_exact(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_training_learns_merges_and_reserves_special_ids(tokenizer):
    assert eos_id(tokenizer) == 0
    assert tokenizer.token_to_id("<|pad|>") == 1
    # 256 byte symbols + 2 special tokens, then learned merges up to the configured size.
    assert 258 < tokenizer.get_vocab_size() <= 400
    assert len(tokenizer.encode(PROSE).ids) < len(PROSE.encode("utf-8"))


def test_save_then_load_gives_the_same_ids(tokenizer, tmp_path: Path):
    written = save_tokenizer(tokenizer, tmp_path / "tok")
    assert written == tmp_path / "tok" / "tokenizer.json"
    loaded_ways = [
        load_tokenizer(tmp_path / "tok"),
        load_tokenizer(written),
        load_pretrained_tokenizer(written),
    ]
    for loaded in loaded_ways:
        assert loaded.encode(NON_ENGLISH).ids == tokenizer.encode(NON_ENGLISH).ids
        assert eos_id(loaded) == eos_id(tokenizer)
    assert load_pretrained_tokenizer(str(tmp_path / "tok")).get_vocab_size() == tokenizer.get_vocab_size()


def test_user_errors_raise_value_error(tokenizer, tmp_path: Path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(TRAINING_TEXTS, TokenizerConfig(vocab_size=258))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="neither a local path nor in the Hugging Face cache"):
        load_pretrained_tokenizer("moe-dag-test/no-such-tokenizer")
    with pytest.raises(ValueError, match=re.escape("<|im_end|>")):
        eos_id(tokenizer, "<|im_end|>")


def test_a_model_that_remembers_more_words_gives_the_same_ids(tokenizer):
    texts = [CODE, PROSE, NON_ENGLISH, "", "<|endoftext|> inside a text"] * 3
    roomy = remember_more_words(Tokenizer.from_str(tokenizer.to_str()))
    for ours, theirs in zip(roomy.encode_batch(texts), tokenizer.encode_batch(texts), strict=True):
        assert ours.ids == theirs.ids
