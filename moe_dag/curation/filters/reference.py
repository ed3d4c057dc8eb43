"""datatrove's rule filters as the reference moe-dag's families are compared with, on real installed text.

Used by `tests/test_filters_reference.py` and `benchmarks/filters.py`; needs the `bench` extra
(`pip install -e '.[bench]'`): datatrove without its `processing` extra, which would replace the
`fasttext` module language ID loads lid.176 with, and spaCy, whose blank English pipeline datatrove 0.10
splits English words and sentences with (its rules ship in the wheel: nothing is downloaded).

`installed_documents` gathers real English documents from the machine: every installed distribution's
description (its README, from `METADATA`), the same READMEs cut at blank lines into page-sized pieces
(shorter documents, as on the web), the reference topics behind `help()` (`pydoc_data`), and the
docstrings of the standard library's modules.
"""

from __future__ import annotations

import ast
import importlib.metadata
import random
import re
import sysconfig
from pathlib import Path
from typing import Any

FAMILY_NAMES = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def installed_documents(min_chars: int = 1) -> list[str]:
    """Real English documents shipped with Python and its installed packages, sorted and deduplicated."""
    from pydoc_data.topics import topics

    readmes = []
    for dist in importlib.metadata.distributions():
        description = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if isinstance(description, str) and description.strip():
            readmes.append(description.strip())
    texts = set(readmes)
    for readme in readmes:
        texts.update(_pieces(readme))
    texts.update(topic.strip() for topic in topics.values())
    texts.update(stdlib_docstrings())
    return sorted(text for text in texts if len(text) >= min_chars)


def _pieces(text: str, words_per_piece: int = 250) -> list[str]:
    """`text` cut at blank lines into pieces of about `words_per_piece` words."""
    pieces, current, words = [], [], 0
    for paragraph in re.split(r"\n\s*\n", text):
        current.append(paragraph)
        words += len(paragraph.split())
        if words >= words_per_piece:
            pieces.append("\n\n".join(current).strip())
            current, words = [], 0
    if current:
        pieces.append("\n\n".join(current).strip())
    return pieces if len(pieces) > 1 else []


def stdlib_docstrings() -> list[str]:
    """The module docstrings of the standard library's top-level modules."""
    docstrings = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if docstring:
            docstrings.append(docstring.strip())
    return docstrings


def datatrove_filters() -> dict[str, Any]:
    """datatrove's four rule filters with their default settings, keyed by moe-dag family name."""
    try:
        from datatrove.pipeline.filters import (
            C4QualityFilter,
            FineWebQualityFilter,
            GopherQualityFilter,
            GopherRepetitionFilter,
        )
    except ImportError as error:
        raise ImportError(
            f"the datatrove comparison needs the 'bench' extra (pip install -e '.[bench]'): {error}"
        ) from error

    return {
        "gopher_repetition": GopherRepetitionFilter(),
        "gopher_quality": GopherQualityFilter(),
        "c4": C4QualityFilter(),
        "fineweb": FineWebQualityFilter(),
    }


def datatrove_keep(reference_filter: Any, text: str) -> tuple[bool, str | None]:
    """datatrove's decision on one text: (keep, its reason code when dropped)."""
    from datatrove.data import Document

    result = reference_filter.filter(Document(text=text, id="0"))
    if isinstance(result, tuple):
        return bool(result[0]), result[1]
    return bool(result), None


# lid.176 names Norwegian Bokmål "no"; the gettext locales name it "nb".
_LOCALE_TO_LABEL = {"nb": "no"}


def labelled_language_samples(
    per_language: int = 20, chars: int = 200, min_messages: int = 2000, seed: int = 0
) -> dict[str, list[str]]:
    """Real translated text by language: samples of ~`chars` characters of gettext messages.

    From the `.mo` catalogues installed on the machine (the translations of coreutils, apt, bash, ...):
    each locale with at least `min_messages` messages gives `per_language` samples of whole messages
    joined by spaces, labelled with the locale's language ("pt_BR" and "pt_PT" are "pt"). Script variants
    ("sr@latin") are left out: their label would not say which script to expect.
    """
    from moe_dag.curation.demo_corpus.gettext_text import find_catalogues, read_mo_messages

    rng = random.Random(seed)
    by_language: dict[str, list[str]] = {}
    for locale, paths in sorted(find_catalogues().items()):
        if "@" in locale:
            continue
        language = locale.split("_")[0]
        messages = [
            " ".join(text.split())
            for path in paths
            for _, text in read_mo_messages(path)
            if len(text) >= 20 and sum(map(str.isalpha, text)) >= 0.8 * len(text.replace(" ", ""))
        ]
        by_language.setdefault(_LOCALE_TO_LABEL.get(language, language), []).extend(messages)
    samples: dict[str, list[str]] = {}
    for language, messages in sorted(by_language.items()):
        if len(messages) < min_messages:
            continue
        rng.shuffle(messages)
        picked, current = [], []
        for message in messages:
            current.append(message)
            if sum(map(len, current)) >= chars:
                picked.append(" ".join(current))
                current = []
                if len(picked) == per_language:
                    break
        samples[language] = picked
    return samples


SPACY_ENGLISH = Path(__file__).with_name("spacy_english.py")


def write_spacy_english(path: str | Path = SPACY_ENGLISH) -> None:
    """Regenerate `spacy_english.py` from the installed spaCy (when datatrove moves to another spaCy)."""
    import spacy
    from spacy.pipeline import Sentencizer
    from spacy.symbols import ORTH

    tokenizer = spacy.blank("en").tokenizer
    special = {key: tuple(piece[ORTH] for piece in pieces) for key, pieces in tokenizer.rules.items()}
    lines = [
        f'"""spaCy\'s English tokenizer tables (spaCy {spacy.__version__}, `spacy.blank("en")`, MIT '
        "licence), copied as data.\n\nGenerated, not written by hand: prefix, suffix, infix and URL "
        "patterns and the "
        'special cases of\n`spacy.blank("en").tokenizer`, and the punctuation of spaCy\'s `Sentencizer`. '
        "`text.py` runs spaCy's\ntokenizer algorithm over them. Regenerate with "
        '`moe_dag.curation.filters.reference.write_spacy_english()`.\n"""\n\n# ruff: noqa: E501\n',
        f"PREFIX = {tokenizer.prefix_search.__self__.pattern!r}\n",
        f"SUFFIX = {tokenizer.suffix_search.__self__.pattern!r}\n",
        f"INFIX = {tokenizer.infix_finditer.__self__.pattern!r}\n",
        f"URL = {tokenizer.url_match.__self__.pattern!r}\n",
        f"SENTENCE_PUNCTUATION = frozenset({tuple(Sentencizer.default_punct_chars)!r})\n",
        "SPECIAL_CASES = {\n",
        *(f"    {key!r}: {special[key]!r},\n" for key in sorted(special)),
        "}\n",
    ]
    Path(path).write_text("".join(lines))
