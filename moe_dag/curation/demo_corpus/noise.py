"""The noise injected into the demo corpus: one text transformation per kind.

Each noisy document records its kind in `metadata["demo_noise"]` (and `metadata["duplicate_of"]` for
the duplicate kinds), so every stage can be scored against ground truth. Clean documents have no
`demo_noise` key. Each kind is `noise_rate` of a source's documents (at least one), except `too_long`:
a single 120,000-word document in `prose`, enough to cross the 100,000-word cut of the Gopher rules
without a corpus of several megabytes.

| kind                   | sources    | made from                                                       |
| ---------------------- | ---------- | --------------------------------------------------------------- |
| exact_duplicate        | all        | a clean document of the same source, copied                     |
| near_duplicate         | all        | a clean document with about one word edit per 150 words         |
| cross_source_duplicate | code, intl | a clean prose document, copied                                  |
| non_english            | prose      | a translated-messages document (the intl kind)                  |
| too_short              | all        | the first 3 to 8 words of an unused document                    |
| too_long               | prose      | clean prose documents, concatenated past 120,000 words          |
| boilerplate            | all        | an unused document framed by repeated navigation/banner lines   |
| toxic                  | all        | an unused document with 2 or 3 insulting sentences inserted     |

Near duplicates keep an estimated word-5-gram Jaccard similarity above 0.9 with their original: each
edit changes at most 5 of the n shingles, so J >= (n - 5e) / (n + 5e) ~ 0.94 for e = n / 150.
"""

from __future__ import annotations

import itertools
import random
import re
from typing import Literal

Style = Literal["code", "web"]

NOISE_KINDS = (
    "exact_duplicate",
    "near_duplicate",
    "cross_source_duplicate",
    "non_english",
    "too_short",
    "too_long",
    "boilerplate",
    "toxic",
)
_EVERY_SOURCE = ("exact_duplicate", "near_duplicate", "too_short", "boilerplate", "toxic")
NOISE_BY_SOURCE = {
    "code": (*_EVERY_SOURCE, "cross_source_duplicate"),
    "prose": (*_EVERY_SOURCE, "non_english", "too_long"),
    "intl": (*_EVERY_SOURCE, "cross_source_duplicate"),
}
TOO_LONG_WORDS = 120_000
WORDS_PER_EDIT = 150

# Insults without slurs; alt-profanity-check's predict_prob gives each of them more than 0.98.
TOXIC_SENTENCES = (
    "you are a stupid worthless idiot",
    "shut up, you pathetic moron",
    "what a fucking idiot you are",
    "go to hell you piece of shit",
    "nobody cares about your dumb opinion, loser",
    "this is the work of a complete dumbass",
    "fuck off you useless bastard",
    "this crap was written by an idiot",
)

# (header block, separator between body lines, footer block) repeated around a document's lines.
BOILERPLATE = {
    "web": (
        ["Home | About | Products | Blog | Contact", "Log in | Sign up | Cart (0)", "Search this site"],
        "We use cookies to improve your experience. By continuing to browse you accept our use of cookies.",
        [
            "Subscribe to our newsletter for the latest updates.",
            "Privacy Policy | Terms of Service | Cookie Settings",
            "(c) 2024 All rights reserved.",
            "Follow us on Facebook, Twitter and Instagram",
        ],
    ),
    "code": (
        ["# " + "=" * 70, "# AUTO-GENERATED FILE. DO NOT EDIT BY HAND.", "# " + "=" * 70],
        "# --- generated section: changes will be overwritten ---",
        ["# end of generated code", "# Copyright (c) 2024 Example Corp. All rights reserved."],
    ),
}
BOILERPLATE_REPEATS = 3
BOILERPLATE_BODY_LINES = 20
BOILERPLATE_EVERY = 3


def noise_counts(source: str, docs_per_source: int, noise_rate: float) -> dict[str, int]:
    """How many documents of each noise kind a source of `docs_per_source` documents gets."""
    if noise_rate == 0:
        return {}
    per_kind = max(1, round(noise_rate * docs_per_source))
    return {kind: 1 if kind == "too_long" else per_kind for kind in NOISE_BY_SOURCE[source]}


def near_duplicate_text(rng: random.Random, text: str) -> str:
    """`text` with about one word in 150 replaced by another of its words, or deleted."""
    pieces = re.split(r"(\s+)", text)  # words at even positions, the whitespace between them kept
    positions = [i for i in range(0, len(pieces), 2) if pieces[i]]
    vocabulary = sorted({pieces[i] for i in positions})
    for i in rng.sample(positions, min(len(positions), max(2, len(positions) // WORDS_PER_EDIT))):
        replacement = rng.choice(vocabulary + [""])  # "" deletes the word
        pieces[i] = replacement if replacement != pieces[i] else ""
    edited = "".join(pieces)
    return edited if edited != text else text + " " + rng.choice(vocabulary)


def too_short_text(rng: random.Random, text: str) -> str:
    return " ".join(text.split()[: rng.randint(3, 8)])


def too_long_text(texts: list[str]) -> str:
    """`texts` joined, cycling through them, until the result has TOO_LONG_WORDS words."""
    parts, words = [], 0
    for text in itertools.cycle(texts):
        parts.append(text)
        words += len(text.split())
        if words >= TOO_LONG_WORDS:
            return "\n\n".join(parts)
    raise AssertionError("unreachable: itertools.cycle never ends")


def boilerplate_text(rng: random.Random, text: str, style: Style) -> str:
    """The first lines of `text` framed by navigation, banner and footer lines, most of them repeated.

    Repeated lines make up more than a third of the result, past the duplicate-line cut (0.30) of the
    Gopher repetition rules.
    """
    header, separator, footer = BOILERPLATE[style]
    body = [line for line in text.splitlines() if line.strip()][:BOILERPLATE_BODY_LINES]
    lines = header * BOILERPLATE_REPEATS
    for i, line in enumerate(body):
        lines.append(line)
        if i % BOILERPLATE_EVERY == BOILERPLATE_EVERY - 1:
            lines.append(separator)
    lines += footer * rng.randint(BOILERPLATE_REPEATS, 2 * BOILERPLATE_REPEATS)
    return "\n".join(lines)


def toxic_text(rng: random.Random, text: str, style: Style) -> str:
    """`text` with 2 or 3 insulting sentences inserted between its lines (as comments in code)."""
    lines = text.splitlines()
    for sentence in rng.sample(TOXIC_SENTENCES, rng.randint(2, 3)):
        line = f"# {sentence}" if style == "code" else sentence[0].upper() + sentence[1:] + "!"
        lines.insert(rng.randint(0, len(lines)), line)
    return "\n".join(lines)
