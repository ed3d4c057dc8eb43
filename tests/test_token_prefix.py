"""Backbone.tokenize from text prefixes gives the ids and masks of tokenising each whole text, on real text
not written for the test, for BERT's WordPiece and for byte-level BPE with GPT-2's, Llama 3's and o200k's
pre-tokenizer regexes."""

from __future__ import annotations

import gzip
import json
import os
import pydoc_data.topics
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from moe_dag.quality.heads import Backbone, BackboneConfig, load_backbone
from moe_dag.quality.heads.token_prefix import CHARS_PER_TOKEN, SPLIT_REGEXES, prefix_chars, text_prefix

PARALLEL = Path(__file__).parent / "fixtures" / "multilingual" / "gettext_parallel.jsonl.gz"
BATCH = 32


def _stdlib_texts() -> list[str]:
    sources = sorted(Path(os.__file__).parent.glob("*.py"))[::3]
    return list(pydoc_data.topics.topics.values()) + [path.read_text(encoding="utf-8") for path in sources]


def _translations() -> list[str]:
    """22 languages' GNOME messages (CJK, Thai, Arabic, Devanagari, ...)."""
    with gzip.open(PARALLEL, "rt", encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines]


def _without_whitespace(texts: list[str]) -> list[str]:
    """Minified code and unspaced scripts: nowhere to cut, so tokenised whole."""
    return ["".join(text.split()) for text in texts]


def _around(text: str, chars: int) -> list[str]:
    """The text with a space just before, at and just after the cut point, and ending near it."""
    flat = "".join(text.split())
    spaced = [flat[:at] + " " + flat[at:] for at in range(chars - 2, chars + 3)]
    return spaced + [text[:length] for length in range(chars - 2, chars + 3)]


def _awkward(chars: int) -> list[str]:
    """Separators a normaliser or pre-tokenizer might treat unlike a space, next to the cut, and words
    that give one [UNK] each for a hundred characters (too few tokens: the whole text is tokenised)."""
    pieces = ["\x1c", "\u00a0", "\u3000", "\u0301", "\n", ".\n", "\t", "  ", "'s", "\u200b", "\x00"]
    texts = [("word" + piece) * (chars // 4) + " tail" for piece in pieces]
    texts += [" ".join(["ab" + piece + "cd"] * chars) for piece in pieces]
    return texts + [" ".join(["x" * 150] * 40), "", " ", "x", " " * (2 * chars)]


def _corpus(chars: int) -> list[str]:
    stdlib, translations = _stdlib_texts(), _translations()
    around = [variant for text in stdlib[:20] + translations[::20] for variant in _around(text, chars)]
    return (
        stdlib
        + translations
        + _without_whitespace(stdlib[:10] + translations[::10])
        + around
        + _awkward(chars)
    )


def _assert_same_as_whole_texts(backbone: Backbone, texts: list[str]):
    assert backbone.prefix_chars is not None
    n = backbone.config.max_tokens
    for start in range(0, len(texts), BATCH):
        batch = texts[start : start + BATCH]
        whole = backbone.tokenizer(batch, padding=True, truncation=True, max_length=n, return_tensors="pt")
        ids, mask = backbone.tokenize(batch)
        assert ids.dtype == whole["input_ids"].dtype and mask.dtype == whole["attention_mask"].dtype
        assert torch.equal(ids, whole["input_ids"]), f"texts {start}..{start + len(batch)}"
        assert torch.equal(mask, whole["attention_mask"]), f"texts {start}..{start + len(batch)}"


def _windows() -> list[str]:
    """300 characters from the start and the middle of varied texts: every cut in them is checked."""
    texts = _stdlib_texts()[::4] + _translations()[::8] + _awkward(64)
    return [text[at : at + 300] for text in texts for at in (0, len(text) // 2)]


def _assert_every_cut_keeps_the_tokens_before_it(tokenizer: PreTrainedTokenizerBase):
    """The tokens of each prefix `text_prefix` can give are the first tokens of the whole text: the
    property the truncated ids rest on, checked at every cut, not only where truncation would show it."""
    for window in _windows():
        prefixes = sorted({text_prefix(window, chars) for chars in range(len(window) + 1)})
        whole = tokenizer(window, add_special_tokens=False)["input_ids"]
        for prefix, ids in zip(
            prefixes, tokenizer(prefixes, add_special_tokens=False)["input_ids"], strict=True
        ):
            assert whole[: len(ids)] == ids, (window, prefix)


@pytest.mark.parametrize("max_tokens", [32, 128])
def test_minilm_ids_and_masks_match_tokenising_whole_texts(max_tokens):
    backbone = load_backbone(BackboneConfig(max_tokens=max_tokens))
    _assert_same_as_whole_texts(backbone, _corpus(CHARS_PER_TOKEN * max_tokens))


def test_minilm_cuts_keep_the_tokens_before_them():
    _assert_every_cut_keeps_the_tokens_before_it(load_backbone(BackboneConfig()).tokenizer)


def _byte_level_bpe(pre_tokenizer: pre_tokenizers.PreTokenizer) -> Tokenizer:
    """A byte-level BPE trained with `pre_tokenizer`, so that its merges include the pieces that
    pre-tokenizer makes (".\n" for Llama 3's and o200k's, which GPT-2's never makes)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_stdlib_texts()[::2] + _translations()[::4], trainer=trainer)
    return tokenizer


def _split_then_byte_level(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), "isolated"), pre_tokenizers.ByteLevel(use_regex=False)]
    )


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    return _byte_level_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False))


def _wrapped(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|pad|>")


def _decoder_backbone(tokenizer: Tokenizer, max_tokens: int) -> Backbone:
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    return Backbone(
        LlamaModel(config),
        _wrapped(tokenizer),
        BackboneConfig(max_tokens=max_tokens, probe_layer=1, judge_layer=2),
    )


def test_byte_level_ids_and_masks_match_tokenising_whole_texts(byte_level):
    """GPT-2's regex, Llama 3's and gpt-oss's (o200k)."""
    texts = _corpus(CHARS_PER_TOKEN * 64)
    splits = [_byte_level_bpe(_split_then_byte_level(regex)) for regex in sorted(SPLIT_REGEXES)]
    for tokenizer in [byte_level, *splits]:
        backbone = _decoder_backbone(tokenizer, 64)
        _assert_same_as_whole_texts(backbone, texts)
        _assert_every_cut_keeps_the_tokens_before_it(backbone.tokenizer)


def test_texts_are_tokenised_whole_where_a_cut_is_not_proven_exact(byte_level):
    """Pre-tokenizers whose pieces may span a space, a normaliser before byte-level BPE, added tokens
    holding a space, truncation from the left."""
    spanning, metaspace, normalised, spaced_token = (
        Tokenizer.from_str(byte_level.to_str()) for _ in range(4)
    )
    spanning.pre_tokenizer = _split_then_byte_level(r"\S+\s*")
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    normalised.normalizer = normalizers.NFKC()
    spaced_token.add_tokens(["end of"])
    for tokenizer in (spanning, metaspace, normalised, spaced_token):
        assert prefix_chars(_wrapped(tokenizer), 64) is None
    from_the_left = _wrapped(byte_level)
    from_the_left.truncation_side = "left"
    assert prefix_chars(from_the_left, 64) is None
    assert prefix_chars(_wrapped(byte_level), 64) == CHARS_PER_TOKEN * 64
