"""The two rubrics an oracle scores documents with, and how scores become one quality number.

"general" text follows the HelpSteer2 attributes (helpfulness, correctness, coherence, complexity,
verbosity; integers 0-4, arXiv:2406.08673). "code" follows the OpenCoder-style code-quality axes
(readability, modularity, clarity, reusability; integers 0-10).

A rubric owns everything a label depends on besides the model: the dimensions, the prompt (versioned by
PROMPT_VERSION, part of the label cache key), the JSON schema used for structured decoding, the
validation of a reply and the reduction of the scores to one number in [0, 1] (`aggregate`), which is
what keep decisions are made on. The heads learn every dimension, not only the aggregate.

Which rubric a document gets follows its source's kind (`rubric_for_kind`), never the source's name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from moe_dag.storage.schema import SOURCE_KINDS

# Bump whenever the prompt text, the dimensions or their descriptions change: cached labels made with an
# older prompt are not comparable.
PROMPT_VERSION = "rubric-v1"


@dataclass(frozen=True, kw_only=True)
class Rubric:
    name: str
    dimensions: tuple[str, ...]
    max_score: int
    guidance: Mapping[str, str]
    # A dimension scored "best in the middle" rather than "more is better" (see `quality`).
    centred: frozenset[str] = frozenset()

    def validate(self, scores: Mapping[str, Any]) -> dict[str, int]:
        """Return the scores as plain ints; ValueError naming the first bad or missing dimension."""
        unknown = sorted(set(scores) - set(self.dimensions))
        if unknown:
            raise ValueError(f"rubric {self.name!r}: unknown dimension {unknown[0]!r}")
        checked = {}
        for dim in self.dimensions:
            if dim not in scores:
                raise ValueError(f"rubric {self.name!r}: missing dimension {dim!r}")
            value = scores[dim]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"rubric {self.name!r}: dimension {dim!r} must be an integer, got {value!r}")
            if not 0 <= value <= self.max_score:
                raise ValueError(
                    f"rubric {self.name!r}: dimension {dim!r} = {value} is outside 0..{self.max_score}"
                )
            checked[dim] = value
        return checked

    def normalise(self, scores: Mapping[str, Any]) -> list[float]:
        """The validated scores as fractions of the scale, in `dimensions` order."""
        checked = self.validate(scores)
        return [checked[dim] / self.max_score for dim in self.dimensions]

    def aggregate(self, normalised_NK: np.ndarray, weights: Mapping[str, float] | None = None) -> np.ndarray:
        """One number in [0, 1] per row of normalised dimension scores (N, K): their weighted mean.

        A centred dimension (verbosity) counts 1 at the middle of its scale and falls linearly to 0 at
        both ends: for pretraining data neither a terse stub nor padded, rambling text is what we want
        more of, so "more verbose" must not mean "better". Every other dimension counts as it is.
        `weights` maps dimension names to weights (missing: 1), the configured keep aggregate.
        """
        values_NK = np.asarray(normalised_NK, dtype=np.float64)
        centred_K = np.array([dim in self.centred for dim in self.dimensions])
        values_NK = np.where(centred_K, 1.0 - np.abs(2.0 * values_NK - 1.0), values_NK)
        weights_K = np.array([(weights or {}).get(dim, 1.0) for dim in self.dimensions], dtype=np.float64)
        return values_NK @ weights_K / weights_K.sum()

    def quality(self, scores: Mapping[str, Any]) -> float:
        """The equally weighted aggregate of one label's scores."""
        return float(self.aggregate(np.array([self.normalise(scores)]))[0])

    def json_schema(self) -> dict[str, Any]:
        """JSON schema of a reply: one bounded integer per dimension, nothing else."""
        return {
            "type": "object",
            "properties": {
                dim: {"type": "integer", "minimum": 0, "maximum": self.max_score} for dim in self.dimensions
            },
            "required": list(self.dimensions),
            "additionalProperties": False,
        }

    def prompt(self, text: str, rejected: str | None = None) -> list[dict[str, str]]:
        """Chat messages asking a model to score `text` on this rubric, replying with JSON only.

        `rejected` (why an earlier reply was refused) turns the request into a retry: the user message
        then ends with that reason and the JSON schema, so the retry is not the request that failed.
        """
        lines = [f"- {dim} (0-{self.max_score}): {self.guidance[dim]}" for dim in self.dimensions]
        example = json.dumps(dict.fromkeys(self.dimensions, self.max_score // 2))  # format only
        system = (
            "You rate documents for a language-model pretraining corpus. Score the document on each "
            f"dimension with an integer from 0 to {self.max_score}:\n"
            + "\n".join(lines)
            + f"\nReply with a JSON object only, with exactly these keys, for example {example}."
        )
        user = f"Document:\n<document>\n{text}\n</document>"
        if rejected is not None:
            user += (
                f"\n\nAn earlier reply to this request was rejected ({rejected[:300]}). Reply with one JSON "
                f"object only, matching this JSON schema: {json.dumps(self.json_schema(), sort_keys=True)}"
            )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def parse_reply(self, reply: str) -> dict[str, int]:
        """Validated scores from a model reply; ValueError when it is not the JSON object asked for.

        Reasoning models served without a reasoning parser may print their thoughts before the answer,
        so when the whole reply is not JSON the last {...} span is tried (the object asked for is flat).
        """
        try:
            payload = _json_value(reply)
        except ValueError:
            start, end = reply.rfind("{"), reply.rfind("}")
            if start < 0 or end < start:
                raise ValueError(f"rubric {self.name!r}: reply is not JSON: {reply[:200]!r}") from None
            try:
                payload = _json_value(reply[start : end + 1])
            except ValueError as err:
                raise ValueError(f"rubric {self.name!r}: reply is not JSON: {reply[:200]!r}") from err
        if not isinstance(payload, dict):
            raise ValueError(f"rubric {self.name!r}: reply is not a JSON object: {reply[:200]!r}")
        return self.validate(payload)


def _json_value(text: str) -> Any:
    """`text` parsed as JSON; ValueError also for nesting too deep for the parser."""
    try:
        return json.loads(text)
    except RecursionError as err:
        raise ValueError("JSON nested too deeply") from err


GENERAL = Rubric(
    name="general",
    dimensions=("helpfulness", "correctness", "coherence", "complexity", "verbosity"),
    max_score=4,
    guidance={
        "helpfulness": "how much useful information or skill a reader could learn from the text",
        "correctness": "factual accuracy and freedom from garbled, broken or spam text",
        "coherence": "clarity and logical flow of the writing",
        "complexity": "depth of knowledge needed to write it (0 = anyone, 4 = expert)",
        "verbosity": "amount of detail (0 = terse fragment, 2 = appropriate, 4 = padded and repetitive)",
    },
    centred=frozenset({"verbosity"}),
)

CODE = Rubric(
    name="code",
    dimensions=("readability", "modularity", "clarity", "reusability"),
    max_score=10,
    guidance={
        "readability": "formatting, line length, naming and comments that make the code easy to read",
        "modularity": "logic split into well-sized functions, classes or modules",
        "clarity": "intent made explicit through docstrings, descriptive names and straightforward flow",
        "reusability": "self-contained units with clean interfaces, no hidden global state",
    },
)

RUBRICS = {rubric.name: rubric for rubric in (GENERAL, CODE)}


def rubric_for_kind(kind: str) -> Rubric:
    """The code rubric for sources of kind "code"; the general rubric for every other source kind."""
    if kind not in SOURCE_KINDS:
        raise ValueError(f"unknown source kind {kind!r}; kinds: {list(SOURCE_KINDS)}")
    return CODE if kind == "code" else GENERAL


def rubric_by_name(name: str) -> Rubric:
    if name not in RUBRICS:
        raise ValueError(f"unknown rubric {name!r}; known: {sorted(RUBRICS)}")
    return RUBRICS[name]
