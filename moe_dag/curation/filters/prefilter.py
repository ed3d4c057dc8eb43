"""The first pass over raw documents: size, language, the four heuristic rule families and perplexity
outliers for text; file rules for code.

`PrefilterConfig.reference()` holds the references' own defaults (datatrove's `GopherQualityFilter`,
`GopherRepetitionFilter`, `C4QualityFilter`, `FineWebQualityFilter`); `PrefilterConfig()` departs from them
only where a rule misfires on real text, each departure one field named in its family's module and in the
README. A source changes any field through its `prefilter:` block in the pipeline config.

Order: the size guard first (it bounds the work any later rule does on one document), then language ID,
then the families in FineWeb's pipeline order (Gopher repetition, Gopher quality, C4, FineWeb), so the
reason recorded is the one FineWeb would have given, and last the perplexity cut, whose model trains on
the documents the rules kept and whose percentiles are those of the whole source (a whole-table filter).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moe_dag.curation.filters.base import DocumentFilter
from moe_dag.curation.filters.c4 import C4Config, C4QualityFilter
from moe_dag.curation.filters.code import CodeConfig, CodeFilter
from moe_dag.curation.filters.fineweb import FineWebConfig, FineWebQualityFilter
from moe_dag.curation.filters.gopher_quality import GopherQualityConfig, GopherQualityFilter
from moe_dag.curation.filters.gopher_repetition import GopherRepetitionConfig, GopherRepetitionFilter
from moe_dag.curation.filters.language import LanguageConfig, LanguageFilter
from moe_dag.curation.filters.perplexity import PerplexityConfig, PerplexityFilter
from moe_dag.curation.filters.size import DocumentSizeFilter, SizeConfig
from moe_dag.curation.filters.text import ScriptRules
from moe_dag.storage.schema import SOURCE_KINDS

FAMILIES = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def _kind_defaults() -> dict[str, dict[str, Any]]:
    """Settings each kind of text changes from the web-page defaults (docs/languages.md)."""
    # Short social posts are judged as posts: a few words, one line, no five sentences, no stop-word
    # count; hashtags are not the "#" spam Gopher's ratio looks for, and in a ten-word post the
    # punctuation tokens alone ("Rainy Sunday, tea and a good book. Perfect.": 8 of 11) fall under 0.8.
    social = {
        "families": ["gopher_repetition", "gopher_quality"],
        "gopher_quality": {
            "min_words": 3,
            "min_stop_words": 0,
            "max_symbol_word_ratio": 0.5,
            "min_alphabetic_word_fraction": 0.5,
        },
    }
    # Forum answers are shorter than web pages and often a line or two: one sentence and 20 words make
    # an answer; the page-level line rules of C4 and FineWeb still judge longer ones.
    forum = {
        "gopher_quality": {"min_words": 20},
        "c4": {"min_sentences": 1},
    }
    # Encyclopedia articles (tests/test_filters_reference_kind.py, docs/filters.md): a tokenised dump's
    # `<unk>` stands for a word, not for two punctuation tokens and a word (20 clean reference articles
    # rendered as WikiText-103 is: the web defaults keep 1, these 20); Serbian Wikipedia's `-{...}-` around
    # Latin names is markup, not code (C4 dropped all 45 Serbian articles for their braces, now none).
    # A short article is whole in three sentences, where a web page's main text of fewer than five is
    # mostly a menu or an error page: C4's five drop 230 of 322 Debian package descriptions (short
    # third-person articles, reflowed), three drop 59, articles of one or two sentences and a list.
    reference = {
        "gopher_quality": {"word_placeholders": ["<unk>"]},
        "c4": {"language_variant_markup": True, "min_sentences": 3},
    }
    return {"social": social, "forum": forum, "reference": reference}


def _language_defaults() -> dict[str, dict[str, Any]]:
    """Gopher's word rules per language where its English cuts misread the language (docs/languages.md).

    Measured on parallel text (the same GNOME messages in up to 26 languages, tests/fixtures/multilingual):
    what English says in a median 93 words takes 50 in Tamil, 54 in Telugu, 55 in Malayalam and 66 in
    Korean, so Gopher's 50-word minimum asks those languages for about twice the text; Malayalam's mean
    word length reaches 10.4 (the cut is 10), and Korean's, in Hangul syllable blocks of two or three
    letters each, is 2.6-3.9 (the cut is 3). datatrove counts every punctuation token as a word in the
    alphabetic share, so a language that says the same in fewer words (Czech 74, Russian 76, Ukrainian 78,
    Polish 81, Turkish 69) or splits compounds at hyphens (German) has more punctuation per word: their
    clean documents scored 0.76-0.80 where the English ones scored 0.81 and up (cut 0.8).
    """
    return {
        "dravidian": {"gopher_quality": {"min_words": 25, "max_mean_word_length": 15}},
        "ko": {"gopher_quality": {"min_words": 35, "min_mean_word_length": 1.5}},
        "punctuation_dense": {"gopher_quality": {"min_alphabetic_word_fraction": 0.75}},
    }


@dataclass(kw_only=True)
class PrefilterConfig:
    """Which rule families a text source runs and each one's own settings (each family's config lives
    in its module), plus what a source's kind and a document's language change."""

    # The rule families a text source runs, in this order (any subset of FAMILIES).
    families: tuple[str, ...] = FAMILIES
    size: SizeConfig = field(default_factory=SizeConfig)
    script: ScriptRules = field(default_factory=ScriptRules)
    language: LanguageConfig = field(default_factory=LanguageConfig)
    gopher_repetition: GopherRepetitionConfig = field(default_factory=GopherRepetitionConfig)
    gopher_quality: GopherQualityConfig = field(default_factory=GopherQualityConfig)
    c4: C4Config = field(default_factory=C4Config)
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)
    code: CodeConfig = field(default_factory=CodeConfig)
    perplexity: PerplexityConfig = field(default_factory=PerplexityConfig)
    # The fitted cuts (perplexity) are stored once per source and reused for every later shard
    # (`moe_dag/curation/fits.py`); raising this number, globally or in one source's block, refits them.
    refit: int = 0
    # Changes per kind of source (`SourceConfig.kind`), applied before the source's own `prefilter:`.
    kinds: dict[str, dict[str, Any]] = field(default_factory=_kind_defaults)
    # Changes to the rule families per language (a language ID code, or a group below), applied to the
    # documents language ID found in it, e.g. {"zh": {"c4": {"min_sentences": 3}}}.
    by_language: dict[str, dict[str, Any]] = field(default_factory=_language_defaults)
    # Language groups `by_language` may name, each a list of codes.
    language_groups: dict[str, list[str]] = field(
        default_factory=lambda: {
            "dravidian": ["ta", "te", "ml", "kn"],
            "punctuation_dense": ["cs", "de", "pl", "ru", "tr", "uk"],
        }
    )

    @classmethod
    def reference(cls, **changes: Any) -> PrefilterConfig:
        """The references' own defaults: every departure set back (datatrove 0.10, FineWeb's lid.176 cut)."""
        return cls().with_changes(
            {
                "script": {"line_rules_min_lines": 1, "per_script": False},
                "gopher_quality": {"stop_word_languages": []},
                "gopher_repetition": {"top_ngram_min_count": 1},
                "language": {
                    "second_opinion_min_score": 0.0,
                    "keep_unidentified": False,
                    "short_text_words": 0,
                },
                "kinds": {},
                "by_language": {},
                **changes,
            }
        )

    def __post_init__(self) -> None:
        self.families = tuple(self.families)  # YAML gives lists
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"prefilter.families: unknown {unknown}; known: {list(FAMILIES)}")
        unknown_kinds = sorted(set(self.kinds) - set(SOURCE_KINDS))
        if unknown_kinds:
            raise ValueError(f"prefilter.kinds: unknown kind(s) {unknown_kinds}; known: {list(SOURCE_KINDS)}")
        for kind, changes in self.kinds.items():
            self._check_changes(changes, f"prefilter.kinds[{kind}]", allowed=_CHANGEABLE)
        for language, changes in self.by_language.items():
            self._check_changes(changes, f"prefilter.by_language[{language}]", allowed=FAMILIES)

    def with_changes(self, changes: dict[str, Any]) -> PrefilterConfig:
        """A copy with `changes` (a mapping as in the YAML, nested per family) applied over this config.

        A family setting changed here holds for every language: `by_language` entries for the same
        setting are dropped (unless `changes` sets `by_language` itself), so a source's or a kind's
        explicit `min_words: 3` is not raised back to a language's default of 35.
        """
        changed = _replace(self, changes, "prefilter")
        if "by_language" in changes:
            return changed
        by_language = {
            key: kept
            for key, entry in changed.by_language.items()
            if (kept := _without_settings(entry, changes))
        }
        return (
            changed
            if by_language == changed.by_language
            else dataclasses.replace(changed, by_language=by_language)
        )

    def for_kind(self, kind: str) -> PrefilterConfig:
        """The settings for a source of this kind: `kinds[kind]` applied (nothing for an unlisted kind)."""
        return self.with_changes(self.kinds.get(kind, {}))

    def for_language(self, language: str) -> PrefilterConfig:
        """The settings for documents in `language`: its group's changes, then its own."""
        config = self
        for group, members in self.language_groups.items():
            if language in members and group in self.by_language:
                config = config.with_changes(self.by_language[group])
        return config.with_changes(self.by_language.get(language, {}))

    def family_filter(self, family: str) -> DocumentFilter:
        """The filter of one rule family with these settings."""
        if family == "gopher_repetition":
            return GopherRepetitionFilter(self.gopher_repetition)
        if family == "gopher_quality":
            return GopherQualityFilter(self.gopher_quality, self.script)
        if family == "c4":
            return C4QualityFilter(self.c4, self.script)
        if family == "fineweb":
            return FineWebQualityFilter(self.fineweb, self.script)
        raise ValueError(f"unknown rule family {family!r}; known: {list(FAMILIES)}")

    def _check_changes(self, changes: dict[str, Any], where: str, allowed: tuple[str, ...]) -> None:
        """Refuse a change a kind or language cannot make, naming where it is."""
        if not isinstance(changes, dict):
            raise ValueError(f"{where} must be a mapping, got {changes!r}")
        wrong = sorted(set(changes) - set(allowed))
        if wrong:
            raise ValueError(f"unknown or unchangeable key(s) {wrong} in {where}; allowed: {list(allowed)}")
        for name, value in changes.items():
            if name == "families":
                unknown = sorted(set(value) - set(FAMILIES))
                if unknown:
                    raise ValueError(f"{where}.families: unknown {unknown}; known: {list(FAMILIES)}")
            else:
                _replace(getattr(self, name), value, f"{where}.{name}")


# What a kind may change: everything but the per-kind and per-language tables themselves.
_CHANGEABLE = ("families", "size", "script", "language", *FAMILIES, "code", "perplexity")


def _without_settings(entry: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A `by_language` entry without the family settings `changes` sets."""
    kept = {}
    for family, settings in entry.items():
        overridden = changes.get(family)
        rest = {k: v for k, v in settings.items() if not isinstance(overridden, dict) or k not in overridden}
        if rest:
            kept[family] = rest
    return kept


def _replace(config: Any, changes: dict[str, Any], where: str) -> Any:
    """`config` with `changes` applied, recursing into nested config dataclasses; unknown keys refused."""
    if not isinstance(changes, dict):
        raise ValueError(f"{where} must be a mapping, got {changes!r}")
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {sorted(fields)}")
    values = {}
    for name, value in changes.items():
        current = getattr(config, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            value = _replace(current, value, f"{where}.{name}")
        values[name] = value
    return dataclasses.replace(config, **values)


def build_prefilters(config: PrefilterConfig, kind: str, languages: list[str] | None) -> list[DocumentFilter]:
    """The prefilters for one source, in the order they run.

    `config`: the source's settings, its kind's changes already applied (`PrefilterConfig.for_kind`).
    `kind`: "code", or the kind of text ("web", "reference", "social", ...).
    `languages`: None skips language ID; [] keeps any language; ["en", ...] keeps only those codes.
    """
    size = DocumentSizeFilter(
        max_chars=config.size.max_chars, max_control_char_fraction=config.size.max_control_char_fraction
    )
    if kind == "code":
        if languages is not None:
            raise ValueError(
                f"build_prefilters: kind 'code' takes languages=None (language ID names natural "
                f"languages, not programming languages), got {languages}"
            )
        return [size, CodeFilter(config.code)]
    # A text too short for the most lenient length rule is not identified: that rule drops it.
    shortest = min(
        [_min_words(config), *(_min_words(config.for_language(key)) for key in config.by_language)]
    )
    language_id = (
        []
        if languages is None
        else [LanguageFilter(languages=languages, config=config.language, min_words=shortest)]
    )
    rules = [_family_for_languages(config, family, languages is not None) for family in config.families]
    return [size, *language_id, *rules, perplexity_filter(config.perplexity)]


def _min_words(config: PrefilterConfig) -> int:
    """Words under which a text is too short for language ID: then the length rule drops it."""
    return config.gopher_quality.min_words if "gopher_quality" in config.families else 0


def _family_for_languages(config: PrefilterConfig, family: str, identified: bool) -> DocumentFilter:
    """One family's filter, with its per-language settings where `by_language` changes them."""
    default = config.family_filter(family)
    languages = {
        language for key in config.by_language for language in config.language_groups.get(key, [key])
    }
    changed = {
        language: config.for_language(language)
        for language in sorted(languages)
        if getattr(config.for_language(language), family) != getattr(config, family)
    }
    if not identified or not changed:
        return default
    return ByLanguage(default, {language: own.family_filter(family) for language, own in changed.items()})


class ByLanguage(DocumentFilter):
    """One rule family deciding each document with the settings for its language (`by_language`)."""

    inputs = ("language",)

    def __init__(self, default: DocumentFilter, by_language: dict[str, DocumentFilter]) -> None:
        self.default = default
        self.by_language = by_language
        self.name = default.name
        self.reasons = tuple(dict.fromkeys(r for f in (default, *by_language.values()) for r in f.reasons))
        self.inputs = tuple(dict.fromkeys(("language", *default.inputs)))

    def score(self, texts: list[str], **inputs: list[Any]) -> dict[str, np.ndarray]:
        languages = inputs["language"] or [None] * len(texts)
        groups: dict[str | None, list[int]] = {}
        for i, language in enumerate(languages):
            groups.setdefault(language if language in self.by_language else None, []).append(i)
        columns: dict[str, np.ndarray] = {}
        for language, rows in groups.items():
            doc_filter = self.by_language.get(language, self.default)
            own = {
                name: [values[i] for i in rows]
                for name, values in inputs.items()
                if name in doc_filter.inputs
            }
            for name, values in doc_filter.score([texts[i] for i in rows], **own).items():
                if name not in columns:
                    columns[name] = np.empty(len(texts), dtype=np.asarray(values).dtype)
                columns[name][rows] = values
        columns[f"{self.name}_settings"] = np.array(
            [language if language in self.by_language else None for language in languages], dtype=object
        )
        return columns

    def decide(self, text: str, scores: dict[str, Any]) -> str | None:
        return self.by_language.get(scores[f"{self.name}_settings"], self.default).decide(text, scores)


def perplexity_filter(config: PerplexityConfig) -> PerplexityFilter:
    """The perplexity cut, fitted later on the source's kept documents (see `PerplexityFilter`)."""
    reference = None if config.reference is None else read_texts(config.reference)
    return PerplexityFilter(
        low_percentile=config.low_percentile,
        high_percentile=config.high_percentile,
        order=config.order,
        reference_documents=config.reference_documents,
        min_documents=config.min_documents,
        min_language_documents=config.min_language_documents,
        reference_texts=reference,
    )


def read_texts(path: str) -> list[str]:
    """The `text` column of a .parquet or .jsonl file (local path or fsspec URL)."""
    import fsspec
    import pyarrow.json
    import pyarrow.parquet

    with fsspec.open(path, "rb") as file:
        if path.endswith(".parquet"):
            table = pyarrow.parquet.read_table(file, columns=["text"])
        elif path.endswith((".jsonl", ".json")):
            table = pyarrow.json.read_json(file)
        else:
            raise ValueError(f"perplexity_reference {path}: expected a .parquet or .jsonl file")
    if "text" not in table.column_names:
        raise ValueError(f"perplexity_reference {path}: no 'text' column (columns: {table.column_names})")
    return [text for text in table["text"].to_pylist() if text]
