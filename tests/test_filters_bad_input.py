"""Bad input through every filter a text source runs: each document gets a decision and a reason.

The per-document bound (stated in `size.py` and the README): the size guard drops anything over
`max_chars` (1,000,000 characters) unread, and every later rule is linear in the document, so a document
just under the limit costs a few seconds of CPU and some tens of MB at most. The test holds the worst case,
a 1 MB document through the prefilter and toxicity filters, to 30 s of CPU and 400 MB of Python memory:
ten times what it measured, so a quadratic rule (one that is 1,000 times slower on a 1 MB line than on
a 1 kB one) would fail it while a busy machine does not.
"""

from __future__ import annotations

import random
import time
import tracemalloc

import pyarrow as pa
import pytest

from moe_dag.curation.filters import (
    PrefilterConfig,
    ToxicityConfig,
    build_prefilters,
    build_toxicity_filters,
    run_filters,
)

RNG = random.Random(0)
PARAGRAPH = (
    "The committee will publish its final report on the water supply of the northern district next "
    "spring, after two years of hearings in which farmers, engineers and residents described the wells "
    "that ran dry."
)
BAD_INPUTS = {
    "empty": ("", "empty_document"),
    "whitespace": (" \n\t\n ", "empty_document"),
    "megabytes": (PARAGRAPH * 20_000, "document_too_large"),
    "binary": (bytes(RNG.randrange(256) for _ in range(100_000)).decode("latin-1"), "binary_content"),
    "binary_as_utf8": (
        bytes(RNG.randrange(256) for _ in range(100_000)).decode("utf-8", "replace"),
        "binary_content",
    ),
    "mixed_scripts": ("English text 中文文本 русский текст العربية हिन्दी " * 200, "language_not_allowed"),
    "one_long_line": (("word " * 20_000)[:100_000], None),
    "one_long_token": ("x" * 100_000, None),
}


@pytest.fixture(scope="module")
def filters():
    chain = build_prefilters(PrefilterConfig(), "web", ["en"]) + build_toxicity_filters(
        ToxicityConfig(), "web"
    )
    run_filters(pa.table({"text": [PARAGRAPH * 3]}), chain)  # load the models before anything is measured
    return chain


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_every_bad_input_gets_a_decision_and_a_reason(filters, name):
    text, expected = BAD_INPUTS[name]
    out, stats = run_filters(pa.table({"text": [text]}), filters)
    row = out.to_pylist()[0]
    assert row["keep"] is False and row["reason"], row["reason"]
    if expected is not None:
        assert row["reason"] == expected
    assert stats.documents == 1 and stats.kept == 0


def test_per_document_bound_on_time_and_memory(filters):
    # Real varied text just under the size guard's limit goes through every filter.
    text = "\n\n".join(f"{PARAGRAPH} Paragraph {i} adds {RNG.random():.6f}." for i in range(4500))[:999_000]
    tracemalloc.start()
    started = time.process_time()
    out, _ = run_filters(pa.table({"text": [text]}), filters)
    seconds = time.process_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out["reason"][0].as_py() is not None or out["keep"][0].as_py()
    assert seconds < 30, f"{seconds:.1f} s of CPU for one 1 MB document"
    assert peak < 400e6, f"{peak / 1e6:.0f} MB for one 1 MB document"
