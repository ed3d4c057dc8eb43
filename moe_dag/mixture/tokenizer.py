"""The tokenizer: a byte-level BPE trained on the curated corpus, or a pretrained one loaded from disk.

Byte-level BPE maps every UTF-8 byte to a symbol before merging, so any text (code, prose, any script)
encodes without unknown tokens and decodes back to the exact same string. No normalizer is set for the
same reason: NFC or lower-casing would make the round trip lossy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from moe_dag.training.config import MAX_VOCAB_SIZE
from moe_dag.training.strict_config import Range, check_ranges

TOKENIZER_FILE = "tokenizer.json"
# Words whose BPE merges the model remembers. The library's default, 10,000, fills early on real text and
# then stops taking new words (it never evicts): on 4,000 stdlib documents 35,577 distinct words, and 13%
# of the words met were encoded again from scratch; with room for every word, 2%. 2^18 entries are tens
# of MB at most, and the cache changes no id. A cold cache costs: copying a tokenizer for each shard
# writer, its cache empty, measured 0.84x of encode_batch in benchmarks/tokenizing.py (the baseline's
# cache warm), so loaded tokenizers get the room (a warm worker process keeps its tokenizer over
# shards and sources: StageSpec.warm), copies do not.
WORD_CACHE = 1 << 18
# 256 byte symbols plus the two special tokens are the floor: at that size BPE cannot learn a single merge.
SMALLEST_VOCAB_SIZE = len(pre_tokenizers.ByteLevel.alphabet()) + 3


@dataclass(kw_only=True)
class TokenizerConfig:
    vocab_size: Annotated[int, Range(SMALLEST_VOCAB_SIZE, MAX_VOCAB_SIZE)] = 4096
    min_frequency: int = 2
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|pad|>"
    # The trainer runs in one process and its memory grows with the text it counts (on the demo corpus
    # repeated 16x, 29,671 documents, the driver grew 134 MiB in training against 79 MiB at 1x; on 8,155
    # drawn, 120 MiB against 88), so it learns from a sample of about this many training documents,
    # drawn by id hash in the same share from every source (moe_dag/mixture/curated.py). The
    # default takes the whole demo corpus (1,770 training documents at 1,000 raw a source, ~2,650 at the
    # demo config's 1,500): only a larger corpus is sampled.
    max_training_documents: int = 4096
    # `from: PATH` in the config: a pretrained tokenizer (a tokenizer.json, a model folder holding one, or
    # a hub repo id in the local Hugging Face cache) used as it is instead of training one; the fields
    # above then go unused. Its file's digest is in the tokenizer's code version (tokenizer_settings).
    from_: str | None = None

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.from_ is not None:
            pretrained_tokenizer_file(self.from_)  # refused at load, with the fix, when it is not there
        if self.min_frequency < 1:
            raise ValueError(f"TokenizerConfig.min_frequency={self.min_frequency} must be at least 1")
        if self.max_training_documents < 1:
            raise ValueError(
                f"TokenizerConfig.max_training_documents={self.max_training_documents} must be at least 1"
            )


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """Train a byte-level BPE on `texts`; the special tokens take the first ids (eos 0, pad 1)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[config.eos_token, config.pad_token],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, path: Path) -> Path:
    """Write `tokenizer.json` into the folder `path` (created if missing); returns the file written."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    target = path / TOKENIZER_FILE
    partial = target.with_name(f".{TOKENIZER_FILE}.partial")
    tokenizer.save(str(partial))
    partial.replace(target)
    return target


def load_tokenizer(path: Path) -> Tokenizer:
    """Read a tokenizer saved by `save_tokenizer`: a folder holding `tokenizer.json`, or the file itself."""
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"no {TOKENIZER_FILE} at {path}")
    return remember_more_words(Tokenizer.from_file(str(file)))


def pretrained_tokenizer_file(name_or_path: str | Path) -> Path:
    """The `tokenizer.json` a pretrained tokenizer is read from: the file itself, the one in a model
    folder, or a hub repo id's (e.g. `openai/gpt-oss-20b`) in the local Hugging Face cache. Never
    downloads: a pipeline run must not depend on the network for a file that decides every token id."""
    path = Path(name_or_path)
    if path.exists():
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"no {TOKENIZER_FILE} at {path}")
        return file
    if path.is_absolute() or path.suffix == ".json":  # meant as a file, and not a repo id
        raise ValueError(f"pretrained tokenizer {path} does not exist")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(str(name_or_path), TOKENIZER_FILE)
    if not isinstance(cached, str):
        raise ValueError(
            f"tokenizer {name_or_path!r} is neither a local path nor in the Hugging Face cache "
            f"(downloads are disabled: fetch it once with `hf download {name_or_path} {TOKENIZER_FILE}`)"
        )
    return Path(cached)


def load_pretrained_tokenizer(name_or_path: str | Path) -> Tokenizer:
    """A production tokenizer from disk only (`pretrained_tokenizer_file` says where it may be), encoding
    whole documents: an encoder's tokenizer.json often truncates and pads to its context (all-MiniLM-L6-v2:
    128 tokens), which would cut every document of the mixture and fill it with padding."""
    tokenizer = load_tokenizer(pretrained_tokenizer_file(name_or_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def remember_more_words(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`, its model now remembering up to WORD_CACHE words (ids unchanged); returned for
    chaining. For a tokenizer this process loaded and keeps: the cache pays once it is warm."""
    resize = getattr(tokenizer.model, "_resize_cache", None)  # BPE and Unigram have one; WordPiece does not
    if resize is not None:
        resize(WORD_CACHE)
    return tokenizer


def eos_id(tokenizer: Tokenizer, eos_token: str = TokenizerConfig.eos_token) -> int:
    """The id of the end-of-document token appended after every document."""
    token_id = tokenizer.token_to_id(eos_token)
    if token_id is None:
        raise ValueError(f"tokenizer has no end-of-document token {eos_token!r}")
    return token_id
