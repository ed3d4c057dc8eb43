"""The mixture sampler: which document comes next, so that every prefix of the stream keeps the target ratios.

Deficit rule with deadlines. With target shares w_i (weights normalised to sum 1), t_i tokens drawn from
source i and T = sum t_i, the deficit of source i is d_i = w_i * T - t_i. The next document comes from a
source at or below its share (d_i >= 0), and among those from the one that would first fall a whole
document behind if left alone: the smallest deadline (t_i + L) / w_i, L the longest document of any source
(ties go to the first source by name). Why every prefix stays within one document of target:
- ahead: the deficits sum to 0, so some d_i >= 0 and the rule can always draw. A source is drawn only
  when d_i >= 0, and a document of l <= L tokens lowers d_i by (1 - w_i) * l < L; d_i only rises while
  other sources are drawn. So no source is ever a document ahead.
- behind: this is earliest-deadline-first, the schedule behind Tijdeman's bound for the chairman
  assignment problem (unit lengths). The property tests check |d_i| <= L on random mixtures with skewed
  weights and mixed lengths. The plain rule "draw the largest d_i" does not keep this bound: shares
  1:1:7 with one-token documents leave a source 1.11 documents behind.

Documents of a source come in a seeded permutation, a fresh one per epoch, so the whole stream is a
function of (lengths, weights, seed). The permutation is recomputed from (seed, source, epoch) rather than
stored, which keeps `state_dict()` a few counters however large the corpus.

Epoch cap. A source with few tokens and a large weight is repeated; it may contribute at most
floor(max_epochs * documents) documents. Once it hits that cap it stops, the remaining sources go on with
their weights renormalised among themselves, and `exhausted` names it, so the caller can report the
shortfall instead of hiding it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator

import numpy as np


class MixtureSampler:
    """Yields (source, document index) pairs; stops when every source has hit its epoch cap."""

    def __init__(
        self,
        doc_token_lengths: dict[str, np.ndarray],
        weights: dict[str, float],
        seed: int,
        max_epochs: float,
    ) -> None:
        _validate(doc_token_lengths, weights, seed, max_epochs)
        self.sources = sorted(weights)
        self.seed = seed
        self.max_epochs = max_epochs
        total_weight = sum(weights.values())
        self.target_shares = {source: weights[source] / total_weight for source in self.sources}
        self._lengths = [np.asarray(doc_token_lengths[source], dtype=np.int64) for source in self.sources]
        # The epsilon absorbs float error such as 0.29 * 100 = 28.999999999999996.
        self._caps = [math.floor(max_epochs * len(lengths) + 1e-9) for lengths in self._lengths]
        self._shares = [self.target_shares[source] for source in self.sources]
        self._longest = max(int(lengths.max()) for lengths in self._lengths)
        self._documents = [0] * len(self.sources)
        self._tokens = [0] * len(self.sources)
        self._permutations: dict[int, tuple[int, np.ndarray]] = {}

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return self

    def __next__(self) -> tuple[str, int]:
        i = self._next_source()
        epoch, position = divmod(self._documents[i], len(self._lengths[i]))
        document = int(self._permutation(i, epoch)[position])
        self._documents[i] += 1
        self._tokens[i] += int(self._lengths[i][document])
        return self.sources[i], document

    def _next_source(self) -> int:
        active = [i for i in range(len(self.sources)) if self._documents[i] < self._caps[i]]
        if not active:
            raise StopIteration
        active_share = sum(self._shares[i] for i in active)
        active_tokens = sum(self._tokens[i] for i in active)
        deficits = {i: self._shares[i] / active_share * active_tokens - self._tokens[i] for i in active}
        # Mathematically the largest deficit is >= 0; min() keeps a candidate if rounding says otherwise.
        floor = min(0.0, max(deficits.values()))
        at_or_below_share = [i for i in active if deficits[i] >= floor]
        return min(at_or_below_share, key=lambda i: (self._tokens[i] + self._longest) / self._shares[i])

    def _permutation(self, i: int, epoch: int) -> np.ndarray:
        cached = self._permutations.get(i)
        if cached is None or cached[0] != epoch:
            rng = np.random.default_rng([self.seed, stable_hash(self.sources[i]), epoch])
            cached = (epoch, rng.permutation(len(self._lengths[i])))
            self._permutations[i] = cached
        return cached[1]

    @property
    def exhausted(self) -> list[str]:
        """Sources that hit their epoch cap and will not be drawn again."""
        pairs = zip(self.sources, self._documents, self._caps, strict=True)
        return [source for source, drawn, cap in pairs if drawn >= cap]

    @property
    def tokens_drawn(self) -> dict[str, int]:
        return dict(zip(self.sources, self._tokens, strict=True))

    @property
    def documents_drawn(self) -> dict[str, int]:
        return dict(zip(self.sources, self._documents, strict=True))

    @property
    def epochs(self) -> dict[str, float]:
        """Documents drawn over documents available, per source (2.5 = two and a half passes)."""
        return {s: d / len(n) for s, d, n in zip(self.sources, self._documents, self._lengths, strict=True)}

    def state_dict(self) -> dict:
        """Counters only (JSON-serialisable): the permutations follow from the seed."""
        return {
            "seed": self.seed,
            "sources": {
                source: {"documents": documents, "tokens": tokens, "epoch": documents // len(lengths)}
                for source, documents, tokens, lengths in zip(
                    self.sources, self._documents, self._tokens, self._lengths, strict=True
                )
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()` of a sampler built with the same lengths, weights and seed."""
        if state.get("seed") != self.seed:
            raise ValueError(f"sampler state has seed {state.get('seed')}, this sampler {self.seed}")
        counters = state.get("sources", {})
        if sorted(counters) != self.sources:
            raise ValueError(f"sampler state has sources {sorted(counters)}, this sampler {self.sources}")
        for i, source in enumerate(self.sources):
            documents, tokens = int(counters[source]["documents"]), int(counters[source]["tokens"])
            epoch = documents // len(self._lengths[i])
            if not 0 <= documents <= self._caps[i] or counters[source]["epoch"] != epoch:
                raise ValueError(f"sampler state for {source!r} does not fit its data: {counters[source]}")
            self._documents[i], self._tokens[i] = documents, tokens


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (Python's hash() of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def check_weights(weights: dict[str, float], sources: Iterable[str]) -> None:
    """Raise ValueError unless `weights` gives each of `sources`, and nothing else, a positive weight."""
    sources = set(sources)
    if not weights:
        raise ValueError("mixture weights are empty")
    for source, weight in weights.items():
        if source not in sources:
            raise ValueError(f"mixture weight for unknown source {source!r}; known: {sorted(sources)}")
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"mixture weight for source {source!r} must be positive, got {weight}")
    unweighted = sorted(sources - set(weights))
    if unweighted:
        raise ValueError(f"sources {unweighted} have documents but no mixture weight")


def _validate(
    doc_token_lengths: dict[str, np.ndarray], weights: dict[str, float], seed: int, max_epochs: float
) -> None:
    check_weights(weights, doc_token_lengths)
    for source, lengths in doc_token_lengths.items():
        if len(lengths) == 0:
            raise ValueError(f"source {source!r} has no documents to sample")
        if np.min(lengths) <= 0:
            raise ValueError(f"source {source!r} has a document of {np.min(lengths)} tokens")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"sampler seed must be a non-negative int, got {seed!r}")
    for source, lengths in doc_token_lengths.items():
        if max_epochs * len(lengths) < 1:
            raise ValueError(
                f"max_epochs={max_epochs} lets source {source!r} ({len(lengths)} documents) draw none"
            )
