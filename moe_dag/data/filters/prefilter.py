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

from dataclasses import dataclass, field

from moe_dag.data.filters.base import DocumentFilter
from moe_dag.data.filters.c4 import C4QualityFilter
from moe_dag.data.filters.code import CodeFilter
from moe_dag.data.filters.fineweb import FineWebQualityFilter
from moe_dag.data.filters.gopher_quality import GopherQualityFilter
from moe_dag.data.filters.gopher_repetition import GopherRepetitionFilter
from moe_dag.data.filters.language import LanguageFilter
from moe_dag.data.filters.perplexity import PerplexityFilter
from moe_dag.data.filters.size import DocumentSizeFilter

FAMILIES = {
    "gopher_repetition": GopherRepetitionFilter,
    "gopher_quality": GopherQualityFilter,
    "c4": C4QualityFilter,
    "fineweb": FineWebQualityFilter,
}


@dataclass(kw_only=True)
class PrefilterConfig:
    # The rule families a text source runs, in this order (any subset of FAMILIES).
    families: tuple[str, ...] = ("gopher_repetition", "gopher_quality", "c4", "fineweb")
    # Size guard: documents over this many characters, or mostly control characters, are dropped unread.
    max_chars: int = 1_000_000
    max_control_char_fraction: float = 0.05
    # Language ID (FineWeb keeps fastText scores >= 0.65); per-language cuts override it. The defaults are
    # for languages lid.176 identifies correctly at a median score under 0.65 on the gettext set (README):
    # Croatian (0.39, often confused with Serbian and Bosnian), Scottish Gaelic (0.49), Irish and
    # Slovenian (0.59), Norwegian Nynorsk (0.64).
    min_language_score: float = 0.65
    language_min_scores: dict[str, float] = field(
        default_factory=lambda: {"hr": 0.3, "gd": 0.35, "ga": 0.45, "sl": 0.45, "nn": 0.5}
    )
    # Below this top score no language is identified with any confidence: typically a language the model
    # was not trained on (lid.176 has no Zulu, Xhosa, Maori, Shona, ...), reported as its own reason.
    language_unknown_below: float = 0.3
    # Departures shared by several families (see their modules): line-fraction rules need this many lines;
    # unspaced scripts count letters as words.
    line_rules_min_lines: int = 2
    unspaced_scripts: bool = True
    # Gopher quality (datatrove defaults; 0 turns a rule off).
    gopher_min_words: int = 50
    gopher_max_words: int = 100_000
    gopher_min_mean_word_length: float = 3
    gopher_max_mean_word_length: float = 10
    gopher_max_symbol_word_ratio: float = 0.1
    gopher_max_bullet_line_fraction: float = 0.9
    gopher_max_ellipsis_line_fraction: float = 0.3
    gopher_min_alphabetic_word_fraction: float = 0.8
    gopher_min_stop_words: int = 2
    gopher_stop_words: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")
    gopher_stop_word_languages: tuple[str, ...] = ("en",)
    # Gopher repetition.
    gopher_max_duplicate_paragraph_fraction: float = 0.3
    gopher_max_duplicate_paragraph_char_fraction: float = 0.2
    gopher_max_duplicate_line_fraction: float = 0.3
    gopher_max_duplicate_line_char_fraction: float = 0.2
    gopher_max_top_ngram_char_fraction: dict[int, float] = field(
        default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16}
    )
    gopher_top_ngram_min_count: int = 2
    gopher_max_duplicate_ngram_char_fraction: dict[int, float] = field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )
    # C4 (-1 turns a numeric rule off).
    c4_min_sentences: int = 5
    c4_min_words_per_line: int = 3
    c4_max_word_length: int = 1000
    c4_remove_citations: bool = True
    c4_filter_no_terminal_punct: bool = True
    c4_filter_lorem_ipsum: bool = True
    c4_filter_javascript: bool = True
    c4_filter_curly_bracket: bool = True
    c4_filter_policy: bool = True
    # FineWeb.
    fineweb_min_punctuated_line_fraction: float = 0.12
    fineweb_punctuation_exclude_zero: bool = False
    fineweb_max_short_line_fraction: float = 0.67
    fineweb_short_line_chars: int = 30
    fineweb_max_duplicate_line_char_fraction: float = 0.01
    fineweb_max_newline_word_ratio: float = 0.3
    # Code (The Stack, StarCoder); documentation files in a code source get the prose-file rules.
    code_max_chars: int = 1_000_000
    code_min_lines: int = 5
    code_max_line_length: int = 1000
    code_max_mean_line_length: float = 100.0
    code_min_alphanumeric_fraction: float = 0.25
    code_prose_extensions: tuple[str, ...] = (".md", ".markdown", ".rst", ".txt", ".adoc", ".org")
    # Perplexity outliers (text sources): documents under the low or over the high percentile of the
    # source's perplexity drop. The reference the n-gram model trains on is `perplexity_reference` (a
    # .parquet or .jsonl file with a `text` column), else a sample of the documents the rules kept.
    perplexity_low_percentile: float = 1.0
    perplexity_high_percentile: float = 99.0
    perplexity_order: int = 3
    perplexity_reference: str | None = None
    perplexity_reference_documents: int = 2000
    perplexity_min_documents: int = 100
    # The cuts are percentiles over this many documents of the source (the first, in shard order), fitted
    # once before the source fans out over workers.
    perplexity_sample_documents: int = 100_000

    @classmethod
    def reference(cls, **changes: object) -> PrefilterConfig:
        """The references' own defaults: every departure set back (datatrove 0.10)."""
        return cls(
            **{
                "line_rules_min_lines": 1,
                "unspaced_scripts": False,
                "gopher_stop_word_languages": (),
                "gopher_top_ngram_min_count": 1,
                **changes,
            }
        )

    def __post_init__(self) -> None:
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"PrefilterConfig.families: unknown {unknown}; known: {sorted(FAMILIES)}")
        if self.gopher_min_words > self.gopher_max_words:
            raise ValueError(
                f"PrefilterConfig: gopher_min_words={self.gopher_min_words} > "
                f"gopher_max_words={self.gopher_max_words}"
            )
        if self.gopher_min_mean_word_length > self.gopher_max_mean_word_length:
            raise ValueError(
                f"PrefilterConfig: gopher_min_mean_word_length={self.gopher_min_mean_word_length} > "
                f"gopher_max_mean_word_length={self.gopher_max_mean_word_length}"
            )
        for name in ("gopher_max_top_ngram_char_fraction", "gopher_max_duplicate_ngram_char_fraction"):
            if any(int(n) < 1 for n in getattr(self, name)):
                raise ValueError(
                    f"PrefilterConfig.{name}: n-gram sizes must be >= 1, got {getattr(self, name)}"
                )
            # YAML keys may arrive as strings ("2": 0.2).
            setattr(self, name, {int(n): float(v) for n, v in getattr(self, name).items()})
        if not 0.0 <= self.perplexity_low_percentile < self.perplexity_high_percentile <= 100.0:
            raise ValueError(
                "PrefilterConfig: need 0 <= perplexity_low_percentile < perplexity_high_percentile <= 100"
            )
        for language, score in self.language_min_scores.items():
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"PrefilterConfig.language_min_scores[{language!r}] must lie in [0, 1]")
        for name in ("families", "gopher_stop_words", "gopher_stop_word_languages", "code_prose_extensions"):
            setattr(self, name, tuple(getattr(self, name)))  # YAML gives lists


def build_prefilters(config: PrefilterConfig, kind: str, languages: list[str] | None) -> list[DocumentFilter]:
    """The prefilters for one source, in the order they run.

    `kind`: "code", or the kind of text ("web", "reference", "math", "science", ...).
    `languages`: None skips language ID; [] keeps any language identified at its cut;
    ["en", ...] keeps only those fastText codes.
    """
    size = DocumentSizeFilter(
        max_chars=config.max_chars, max_control_char_fraction=config.max_control_char_fraction
    )
    if kind == "code":
        if languages is not None:
            raise ValueError(
                f"build_prefilters: kind 'code' takes languages=None (fastText identifies natural "
                f"languages, not programming languages), got {languages}"
            )
        return [size, CodeFilter(config)]
    language_id = (
        []
        if languages is None
        else [
            LanguageFilter(
                languages=languages,
                min_score=config.min_language_score,
                min_scores=config.language_min_scores,
                unknown_below=config.language_unknown_below,
                min_words=config.gopher_min_words if "gopher_quality" in config.families else 0,
            )
        ]
    )
    rules = [FAMILIES[family](config) for family in config.families]
    return [size, *language_id, *rules, perplexity_filter(config)]


def perplexity_filter(config: PrefilterConfig) -> PerplexityFilter:
    """The perplexity cut, fitted later on the source's kept documents (see `PerplexityFilter`)."""
    reference = None if config.perplexity_reference is None else read_texts(config.perplexity_reference)
    return PerplexityFilter(
        low_percentile=config.perplexity_low_percentile,
        high_percentile=config.perplexity_high_percentile,
        order=config.perplexity_order,
        reference_documents=config.perplexity_reference_documents,
        min_documents=config.perplexity_min_documents,
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
