"""The one record the demo corpus builders pass around before it becomes a Dolma JSON line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


@dataclass
class DemoDoc:
    id: str  # machine-independent, e.g. "code/stdlib/json/decoder.py#0"
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def num_words(self) -> int:
        return len(self.text.split())


def paragraph_chunks(text: str, *, max_words: int, min_words: int) -> list[str]:
    """Split `text` at blank lines into chunks of at most about `max_words` words.

    A paragraph longer than `max_words` stays whole; a last chunk under `min_words` joins the one before,
    so no chunk of a long text is a stub.
    """
    chunks: list[list[str]] = [[]]
    words = 0
    for paragraph in (p.strip() for p in text.split("\n\n")):
        if not paragraph:
            continue
        size = len(paragraph.split())
        if chunks[-1] and words + size > max_words:
            chunks.append([])
            words = 0
        chunks[-1].append(paragraph)
        words += size
    if len(chunks) > 1 and sum(len(p.split()) for p in chunks[-1]) < min_words:
        chunks[-2].extend(chunks.pop())
    return ["\n\n".join(chunk) for chunk in chunks if chunk]


def round_robin(*streams: Iterator[DemoDoc]) -> Iterator[DemoDoc]:
    """One document from each stream in turn; an exhausted stream drops out."""
    active = list(streams)
    while active:
        for stream in list(active):
            doc = next(stream, None)
            if doc is None:
                active.remove(stream)
            else:
                yield doc
