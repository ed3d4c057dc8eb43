"""Per-source thresholds for early-exit scoring, calibrated on the heads' scores of unseen documents.

A document is dropped at the probe when probe < tau_drop and kept at the probe when probe >= tau_pass
(either way the judge never runs); the rest are kept when judge >= tau_keep. The thresholds are
properties of the heads' score distributions on a source, not of the oracle's labels, so they are
calibrated on documents the heads were not trained on, scored by both heads, labelled or not: the
held-out labels plus a calibration sample of the source.

Exits both ways: at keep rate r, dropping at the probe can spare the judge at most 1 - r of the
documents (30% at the usual 0.7), while the documents the probe is surest the judge keeps are the
larger share. `keep_exits: false` keeps only the drop side, so every kept document carries the judge's
scores.

What bounds the exits is the goal's own measure: at most `max_decisions_changed` of all the calibration
documents are exits the judge would decide otherwise, counted over both sides, and tau_drop and tau_pass
are chosen together to let the most documents leave (`_exits_within_decisions`). The allowance is the
most overturned documents whose exact bound at `exit_z` stays within the share (`allowed_changes`), less
`exit_margin`: the search ends each side just before an overturned document, an edge new documents do
not respect, so on synthetic scores a margin of none let the share on new documents pass 1% in about 20%
of calibrations at 90%, and a margin of 2 (one a side) in 2-5% (`tests/test_calibration_decisions.py`). A
bound per side instead (at most 1% of each side's exits, the library's default until it was removed)
spent little of a 1% budget of decisions: it needed 100 clean exits per overturned one, and stopped a
side at its first overturned document when the exits were fewer.

How many documents: tau_keep is a quantile, and the keep rate it gives on new documents of the source
is off by about z * sqrt(p (1 - p) / n) for keep rate p and n calibration documents. So each source's
calibration sample is sized from the configured precision (`calibration_sample_size`): +-0.03 at 95%
(z = 1.96) and p = 0.7 needs 897 documents. A source smaller than that is calibrated on all of its
documents: on that source the keep rate is then exact, which `Thresholds.n_calibration` < `n_needed`
records. There is no pooled calibration across sources: their score distributions differ.

Per language group inside a source (`per_language`): heads read some scripts far better than others (a
small English backbone keeps Latin text and erases Greek, Bengali or Korean: issue 20), so one threshold
over a multilingual source keeps languages at very different rates. Each language with at least
`min_documents_per_language` calibration documents gets thresholds of its own, calibrated on its
documents alone; the other languages are pooled by the script they are written in (the dominant script
of their documents' letters), and each script group with at least `min_documents_per_script` documents
gets thresholds of its own, shared by its languages; a language in a smaller script group is calibrated
on its own documents, however few (at least 2). So each group keeps about the source's keep rate; the
source's thresholds (calibrated on every document) decide only languages with fewer than 2 calibration
documents or none. Falling back to the source's thresholds sooner erased languages: on the multilingual
fixture Malayalam, with 4 calibration documents and its script alone, got the source's tau_keep 0.734
while the judge scored all 10 of its documents 0.707-0.721 (10-90%), and kept none; the language
medians there spread over 0.697-0.770, five times a language's own 10-90% range. Languages get their
own thresholds from few documents (5) because the heads' bias is per language, not per script: on the
multilingual fixture (tests/fixtures/multilingual) pooling the Latin-script languages kept 0.90-0.95 of
English, German, Spanish and French and 0.05-0.37 of Turkish, Vietnamese and Indonesian, where
thresholds per language kept every language within 0.2 of the source. A group's thresholds carry its
sampling error (about z * sqrt(p (1 - p) / n) on its keep rate).

Early exits of language groups are calibrated over the whole source, not group by group: a group of a
few dozen documents cannot show that its exits change at most 1% of its decisions (1% of 20 documents
is none, so a point estimate lets its surest ones leave until the first mistake, on noise; at 90% even
none overturned bounds the share above 1% on fewer than 229 documents). Each group's probe scores are
centred on its own probe keep threshold (the probe score above which `keep_rate` of its documents lie,
as tau_keep is the judge's), and tau_drop and tau_pass are calibrated once, as offsets from that
centre, on the centred scores of every grouped unseen document of the source against each one's group
decision; a group's thresholds are its centre plus the offsets. The bound then holds over the source's
grouped documents, as decisions changed are counted, and the probe's bias per language, which the
centre removes, is the same bias that made tau_keep per language necessary.

A small language is short of unseen documents by construction: the oracle sample takes its share of
them for training, leaving 4-6 of Malayalam's 11 on the multilingual fixture, whose kept share then
landed anywhere in 0.45-0.82 against the source's 0.63 as the sample moved. So a language with fewer
than `min_unseen_per_language` unseen documents is calibrated on the documents of it the heads trained
on as well (`unseen` marks which are which). Their scores lean towards their labels, a bias far smaller
at these sizes than the sampling error it removes; the source's thresholds, and the exit offsets, still
come from unseen documents only.
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from scipy.stats import beta


@dataclass(kw_only=True)
class CalibrationConfig:
    # tau_keep: the keep rate on the source's new documents within +- keep_rate_tolerance, at z sigmas.
    keep_rate_tolerance: float = 0.03
    z: float = 1.96
    # tau_drop and tau_pass: at most this share of the calibration documents are exits the judge would
    # decide otherwise (the share of decisions early exit changes), both sides counted together ...
    max_decisions_changed: float = 0.01
    # ... at this one-sided confidence, given in normal sigmas (1.28: 90%; 0: a point estimate, no
    # confidence), by the exact (Clopper-Pearson) binomial bound ...
    exit_z: float = 1.28
    # ... less this many overturned documents, because the search stops each side just short of one,
    # which new documents do not respect: with 2 (one a side) the share on new documents stayed within
    # the bound at its confidence (module docstring). At these defaults a source needs 531 unseen
    # documents for any early exit (none of them overturned), 897 allow 2.
    exit_margin: int = 2
    # Also keep at the probe (tau_pass); false: only drops exit, and every kept document has judge scores.
    keep_exits: bool = True
    # Thresholds per language inside a source, for languages with at least this many calibration
    # documents; the other languages are pooled per script, each script group with at least
    # `min_documents_per_script` (a language in a smaller one is calibrated alone, from 2 documents; with
    # fewer the source's decide). False: one set per source.
    per_language: bool = True
    min_documents_per_language: int = 5
    min_documents_per_script: int = 5
    # A language with fewer unseen calibration documents than this also calibrates its group on the
    # documents of it the heads trained on (see the module docstring); the source's own thresholds never do.
    min_unseen_per_language: int = 30

    def __post_init__(self) -> None:
        if not 0.0 < self.keep_rate_tolerance < 0.5:
            raise ValueError(f"keep_rate_tolerance must be in (0, 0.5), got {self.keep_rate_tolerance}")
        if self.z <= 0 or self.exit_z < 0:
            raise ValueError(f"z must be > 0 and exit_z >= 0, got {self.z}, {self.exit_z}")
        if not 0.0 <= self.max_decisions_changed < 1.0 or self.exit_margin < 0:
            raise ValueError(
                "max_decisions_changed must be in [0, 1) and exit_margin >= 0, got "
                f"{self.max_decisions_changed}, {self.exit_margin}"
            )
        if self.min_unseen_per_language < 0:
            raise ValueError(f"min_unseen_per_language must be >= 0, got {self.min_unseen_per_language}")
        if min(self.min_documents_per_language, self.min_documents_per_script) < 2:
            raise ValueError(
                "min_documents_per_language and min_documents_per_script must be at least 2, got "
                f"{self.min_documents_per_language} and {self.min_documents_per_script}"
            )


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    tau_drop: float  # probe aggregate under it: dropped at the probe
    tau_keep: float  # judge aggregate at or above it: kept by the judge
    tau_pass: float | None = None  # probe aggregate at or above it: kept at the probe (None: never)
    rubric: str = "general"  # whose dimension scores the heads output for this source
    n_calibration: int = 0
    n_needed: int = 0  # what the configured precision asks for
    # On the calibration set, per side: share of documents leaving at the probe, and share of those the
    # judge would have decided otherwise (None: nothing leaves on that side).
    drop_exit_rate: float = 0.0
    drop_exit_error: float | None = None
    keep_exit_rate: float = 0.0
    keep_exit_error: float | None = None
    # Thresholds of the language groups calibrated on their own (see the module docstring), by language
    # code (the languages of one script group share one); any other language, or none, is decided by these.
    languages: Mapping[str, Thresholds] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Stored thresholds come back from JSON as plain dicts.
        own = {k: v if isinstance(v, Thresholds) else Thresholds(**v) for k, v in self.languages.items()}
        object.__setattr__(self, "languages", own)

    @property
    def early_exit_rate(self) -> float:
        return self.drop_exit_rate + self.keep_exit_rate

    def for_language(self, language: str | None) -> Thresholds:
        return self.languages.get(language, self) if language is not None else self

    def dropped_at_probe(
        self, probe_N: np.ndarray, languages: Sequence[str | None] | None = None
    ) -> np.ndarray:
        return probe_N < self._per_document("tau_drop", languages, len(probe_N))

    def kept_at_probe(self, probe_N: np.ndarray, languages: Sequence[str | None] | None = None) -> np.ndarray:
        tau_pass_N = self._per_document("tau_pass", languages, len(probe_N))
        return ~self.dropped_at_probe(probe_N, languages) & (probe_N >= tau_pass_N)  # NaN: never

    def kept_by_judge(self, judge_N: np.ndarray, languages: Sequence[str | None] | None = None) -> np.ndarray:
        """Judge aggregate at or above each document's tau_keep (NaN, no judge score: not kept)."""
        return np.nan_to_num(judge_N, nan=-np.inf) >= self._per_document("tau_keep", languages, len(judge_N))

    def _per_document(self, name: str, languages: Sequence[str | None] | None, n: int) -> np.ndarray:
        """Threshold `name` for each of `n` documents, by its language (None in the thresholds: NaN)."""
        if languages is None or not self.languages:
            chosen = [self] * n
        else:
            chosen = [self.for_language(language) for language in languages]
        values = [getattr(t, name) for t in chosen]
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def calibration_sample_size(keep_rate: float, config: CalibrationConfig) -> int:
    """Documents needed for tau_keep to give `keep_rate` within the configured tolerance."""
    if not 0.0 < keep_rate <= 1.0:
        raise ValueError(f"keep rate must be in (0, 1], got {keep_rate}")
    return math.ceil(config.z**2 * keep_rate * (1.0 - keep_rate) / config.keep_rate_tolerance**2)


def _keep_threshold(judge: np.ndarray, keep_rate: float) -> float:
    """A judge threshold keeping `keep_rate` of `judge`, halfway between the last kept and first dropped."""
    ranked = np.sort(judge)[::-1]
    k = min(len(ranked), max(1, round(keep_rate * len(ranked))))
    if k == len(ranked):
        return 0.0  # keep everything: scores are never below 0
    return float((ranked[k - 1] + ranked[k]) / 2)


def _exit_error_bound(failures: np.ndarray, trials: np.ndarray, z: float) -> np.ndarray:
    """Upper end of a one-sided interval for a binomial proportion at normal quantile z: exact
    (Clopper-Pearson), because approximate intervals fall short at the few failures an exit set allows
    (Wilson's bounds none in 165 trials at 1%, where a 1% rate gives none 19% of the time)."""
    if z == 0:
        return failures / trials
    confidence = NormalDist().cdf(z)
    upper = beta.ppf(confidence, failures + 1, np.maximum(trials - failures, 1))
    return np.where(failures < trials, upper, 1.0)


def _split_after(ranked_probe: np.ndarray, count: int, past_the_end: float) -> float:
    """A threshold halfway between the last of `count` exiting scores and the next one in the ranking
    (`past_the_end` when every document exits)."""
    following = ranked_probe[count] if count < len(ranked_probe) else past_the_end
    return float((ranked_probe[count - 1] + following) / 2)


def calibrate_source(
    probe_scores: Sequence[float],
    judge_scores: Sequence[float],
    keep_rate: float,
    config: CalibrationConfig,
    rubric: str = "general",
    languages: Sequence[str | None] | None = None,
    texts: Sequence[str] | None = None,
    unseen: Sequence[bool] | None = None,
) -> Thresholds:
    """Thresholds for one source from both heads' scores on its calibration documents.

    tau_keep: the judge score above which `keep_rate` of the documents lie, so the judge alone keeps
    the target rate.

    tau_drop and tau_pass: early exit must save compute without changing decisions. Ranking documents by
    probe score, the drops are every document under tau_drop and the passes (when `keep_exits`) every
    one at or above tau_pass; the two are chosen together to let the most documents leave with at most
    `allowed_changes` of them decided otherwise by the judge (`_exits_within_decisions`). Each sits
    halfway between its last exited and the next probe score; tau_drop is 0 (no drop exit) and tau_pass
    None (no keep exit) when that side lets nothing leave.

    `languages` and `texts` (the documents' language codes and texts, with `config.per_language`): each
    language group (see the module docstring) gets thresholds of its own, calibrated the same way on its
    documents alone, when the source has more than one language.

    `unseen` (all True when None): which documents the heads did not train on. The source's thresholds
    use only those; a language group uses every document it is given (see the module docstring).
    """
    probe, judge = np.asarray(probe_scores, dtype=np.float64), np.asarray(judge_scores, dtype=np.float64)
    unseen_N = np.ones(len(probe), dtype=bool) if unseen is None else np.asarray(unseen, dtype=bool)
    if len(unseen_N) != len(probe):
        raise ValueError(f"calibrate_source: {len(unseen_N)} unseen flags for {len(probe)} documents")
    source = _calibrate(probe[unseen_N], judge[unseen_N], keep_rate, config, rubric)
    if languages is None or texts is None or not config.per_language:
        return source
    codes = np.array(list(languages), dtype=object)
    if not len(codes) == len(texts) == len(probe):
        raise ValueError(
            f"calibrate_source: {len(codes)} languages and {len(texts)} texts for {len(probe)} documents"
        )
    groups = _language_groups(codes, texts, config)
    if len({language for language in codes if language is not None}) < 2 or not groups:
        return source
    # Each group's judge threshold and probe centre (module docstring), on all its documents.
    centre_N, kept_N = np.full(len(probe), np.nan), np.zeros(len(probe), dtype=bool)
    tau_keeps = []
    for members in groups:
        rows = np.isin(codes, members)
        tau_keeps.append(_keep_threshold(judge[rows], keep_rate))
        centre_N[rows] = _keep_threshold(probe[rows], keep_rate)
        kept_N[rows] = judge[rows] >= tau_keeps[-1]
    pooled = unseen_N & ~np.isnan(centre_N)
    offsets = (
        _exit_thresholds(probe[pooled] - centre_N[pooled], kept_N[pooled], config) if pooled.any() else {}
    )
    own = {}
    for members, tau_keep in zip(groups, tau_keeps, strict=True):
        rows = np.isin(codes, members)
        group = _group_thresholds(probe[rows], kept_N[rows], tau_keep, centre_N[rows][0], offsets)
        own |= dict.fromkeys(members, dataclasses.replace(group, rubric=rubric, n_needed=source.n_needed))
    return dataclasses.replace(source, languages=dict(sorted(own.items())))


def _group_thresholds(
    probe: np.ndarray, kept_by_judge: np.ndarray, tau_keep: float, centre: float, offsets: Mapping[str, float]
) -> Thresholds:
    """A language group's thresholds: its tau_keep, and the source's exit offsets from its probe centre,
    with the exit shares and errors they give on the group's own documents."""
    tau_drop = centre + offsets["tau_drop"] if "tau_drop" in offsets else 0.0
    tau_pass = max(centre + offsets["tau_pass"], tau_drop) if "tau_pass" in offsets else None
    dropped = probe < tau_drop
    passed = ~dropped & (probe >= (math.inf if tau_pass is None else tau_pass))
    return Thresholds(
        tau_drop=tau_drop,
        tau_keep=tau_keep,
        tau_pass=tau_pass,
        n_calibration=len(probe),
        drop_exit_rate=float(dropped.mean()),
        drop_exit_error=float(kept_by_judge[dropped].mean()) if dropped.any() else None,
        keep_exit_rate=float(passed.mean()),
        keep_exit_error=float((~kept_by_judge[passed]).mean()) if passed.any() else None,
    )


def _language_groups(codes: np.ndarray, texts: Sequence[str], config: CalibrationConfig) -> list[list[str]]:
    """Languages calibrated together: each large language alone, the others pooled by script."""
    counts = Counter(language for language in codes if language is not None)
    groups = [[language] for language, n in sorted(counts.items()) if n >= config.min_documents_per_language]
    by_script: dict[str, list[str]] = {}
    for language in sorted(set(counts) - {group[0] for group in groups}):
        scripts = Counter(
            dominant_script(text) for text, code in zip(texts, codes, strict=True) if code == language
        )
        by_script.setdefault(scripts.most_common(1)[0][0], []).append(language)
    for members in by_script.values():
        if sum(counts[language] for language in members) >= config.min_documents_per_script:
            groups.append(members)
        else:
            # The source's thresholds misplace a language more than its own few documents do (module
            # docstring); one document has no quantile.
            groups += [[language] for language in members if counts[language] >= 2]
    return groups


def dominant_script(text: str, letters: int = 400) -> str:
    """The script most of the first `letters` letters are written in: the first word of their Unicode
    names ("LATIN", "CYRILLIC", "CJK", "HANGUL", "DEVANAGARI", ...); "NONE" for a text without letters."""
    scripts: Counter[str] = Counter()
    for char in text:
        if char.isalpha():
            scripts[unicodedata.name(char, "UNKNOWN").split(" ", 1)[0]] += 1
            if scripts.total() >= letters:
                break
    return scripts.most_common(1)[0][0] if scripts else "NONE"


def _calibrate(
    probe_scores: Sequence[float],
    judge_scores: Sequence[float],
    keep_rate: float,
    config: CalibrationConfig,
    rubric: str,
) -> Thresholds:
    probe = np.asarray(probe_scores, dtype=np.float64)
    judge = np.asarray(judge_scores, dtype=np.float64)
    if len(probe) != len(judge):
        raise ValueError(
            f"calibrate_source needs equal lengths, got {len(probe)} probe and {len(judge)} judge scores"
        )
    needed = calibration_sample_size(keep_rate, config)
    n = len(probe)
    if n == 0:
        raise ValueError("calibrate_source: no scored documents to calibrate on")
    tau_keep = _keep_threshold(judge, keep_rate)
    exits = _exit_thresholds(probe, judge >= tau_keep, config)
    return Thresholds(
        tau_keep=tau_keep,
        rubric=rubric,
        n_calibration=n,
        n_needed=needed,
        **{"tau_drop": 0.0} | exits,  # no drop exit: scores are never below 0
    )


def _exit_thresholds(probe: np.ndarray, kept_by_judge: np.ndarray, config: CalibrationConfig) -> dict:
    """tau_drop and tau_pass with each side's exit share and error (see `calibrate_source`); a side
    that cannot exit is left out."""
    n = len(probe)
    thresholds: dict = {}
    ascending = np.argsort(probe, kind="stable")
    ranked = probe[ascending]
    drops, passes = _exits_within_decisions(ranked, kept_by_judge[ascending], config)
    if drops:
        # Past the end: scores may be centred (language groups), so no clamp to [0, 1].
        thresholds["tau_drop"] = _split_after(ranked, drops, ranked[-1] + 1e-6)
        thresholds["drop_exit_rate"] = drops / n
        thresholds["drop_exit_error"] = float(kept_by_judge[ascending[:drops]].mean())
    if passes:
        descending = ascending[drops:][::-1]
        ranked = probe[descending]
        tau_pass = _split_after(ranked, passes, ranked[-1] - 1e-6)
        thresholds["tau_pass"] = max(tau_pass, thresholds.get("tau_drop", -math.inf))
        thresholds["keep_exit_rate"] = passes / n
        thresholds["keep_exit_error"] = float((~kept_by_judge[descending[:passes]]).mean())
    return thresholds


def allowed_changes(n: int, config: CalibrationConfig) -> int:
    """The most documents of `n` the exits may hand a decision the judge would not make: the largest
    count whose bound at `exit_z` is within `max_decisions_changed`, less `exit_margin`; negative when
    not even none is (no early exit)."""
    counts = np.arange(n + 1)
    bound = _exit_error_bound(counts.astype(np.float64), np.full(n + 1, float(n)), config.exit_z)
    within = np.flatnonzero(bound <= config.max_decisions_changed + 1e-12)
    return int(within[-1]) - config.exit_margin if len(within) else -1


def _exits_within_decisions(
    ranked_probe: np.ndarray, kept_by_judge: np.ndarray, config: CalibrationConfig
) -> tuple[int, int]:
    """(drops, passes): the most documents, the lowest `drops` and the highest `passes` of the probe's
    ranking, that can leave at the probe with at most `allowed_changes` of them decided otherwise by the
    judge (kept ones among the drops, dropped ones among the passes), each end where a threshold can
    split the ranking."""
    n = len(ranked_probe)
    allowed = allowed_changes(n, config)
    if allowed < 0 or n == 0:
        return 0, 0
    # Overturned among the first d drops and the first p passes, for d, p in 0..n.
    drop_errors = np.concatenate([[0], np.cumsum(kept_by_judge)])
    pass_errors = np.concatenate([[0], np.cumsum(~kept_by_judge[::-1])])
    splits = np.append(ranked_probe[:-1] != ranked_probe[1:], True)
    drop_ok = np.concatenate([[True], splits])  # d documents can leave below a threshold
    pass_ok = np.concatenate([[True], splits[::-1][1:], [True]])  # p from the top, likewise
    if not config.keep_exits:
        pass_ok[1:] = False
    last_pass_ok = np.maximum.accumulate(np.where(pass_ok, np.arange(n + 1), 0))
    drops = np.flatnonzero(drop_ok & (drop_errors <= allowed))
    room = allowed - drop_errors[drops]
    passes = np.searchsorted(pass_errors, room, side="right") - 1
    passes = last_pass_ok[np.minimum(passes, n - drops)]
    best = int(np.argmax(drops + passes))
    return int(drops[best]), int(passes[best])
