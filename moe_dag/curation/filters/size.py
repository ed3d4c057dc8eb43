"""The guard every source passes first: empty, oversized and binary documents are dropped unread.

It bounds what a single document costs every later filter. The rules after it are linear in the
document's length (one regex pass per rule, n-gram arrays of a few words' size each), so with
`max_chars` = 1,000,000 a document costs at most a few hundred milliseconds and a few hundred MB of
temporary memory in the worst filter (measured in `tests/test_filters_bad_input.py`). Text decoded
from a binary file is mostly control or replacement characters; real text, even code, has almost none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter

# C0 controls except tab, newline and carriage return; DEL and C1 controls; the replacement character.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")


@dataclass(kw_only=True)
class SizeConfig:
    max_chars: int = 1_000_000
    max_control_char_fraction: float = 0.05


# The setting of `SizeConfig` that governs each reason (None: no setting, the document is dropped as it is).
REASON_SETTINGS: dict[str, str | None] = {
    "empty_document": None,
    "document_too_large": "max_chars",
    "binary_content": "max_control_char_fraction",
}


class DocumentSizeFilter(DocumentFilter):
    """Drop empty, oversized or binary-looking documents before any other filter reads them."""

    name = "size"
    reasons = ("empty_document", "document_too_large", "binary_content")

    def __init__(self, *, max_chars: int, max_control_char_fraction: float) -> None:
        if max_chars < 1:
            raise ValueError(f"DocumentSizeFilter: max_chars must be >= 1, got {max_chars}")
        self.max_chars = max_chars
        self.max_control_char_fraction = max_control_char_fraction

    def score(self, texts: list[str]) -> dict[str, np.ndarray]:
        control = [
            len(_CONTROL.findall(text)) / len(text) if 0 < len(text) <= self.max_chars else 0.0
            for text in texts
        ]
        return {
            "char_count": np.array([len(text) for text in texts], dtype=np.int64),
            "control_char_fraction": np.array(control, dtype=np.float32),
        }

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        if not text.strip():
            return "empty_document"
        if scores["char_count"] > self.max_chars:
            return "document_too_large"
        if scores["control_char_fraction"] > self.max_control_char_fraction:
            return "binary_content"
        return None
