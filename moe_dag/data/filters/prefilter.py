"""The cheap first pass over raw documents: language, quality and repetition for text; file rules for code.

Thresholds default to the published ones (see each filter's module); `build_prefilters` picks the
filters a kind of source needs. Language ID runs first because Gopher's and FineWeb's rules were tuned
on the languages we keep, and it is the filter that drops most web text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_dag.data.filters.base import DocumentFilter
from moe_dag.data.filters.code import CodeFilter
from moe_dag.data.filters.language import LanguageFilter
from moe_dag.data.filters.quality import TextQualityFilter
from moe_dag.data.filters.repetition import RepetitionFilter


@dataclass(kw_only=True)
class PrefilterConfig:
    # Language ID (FineWeb keeps fastText scores >= 0.65).
    min_language_score: float = 0.65
    # Text quality: Gopher, with a lower word floor than its 50 so short reference entries survive.
    min_words: int = 20
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_to_word_ratio: float = 0.1
    max_bullet_line_fraction: float = 0.9
    max_ellipsis_line_fraction: float = 0.3
    min_alphabetic_word_fraction: float = 0.8
    # FineWeb line rules.
    min_punctuated_line_fraction: float = 0.12
    max_short_line_fraction: float = 0.67
    short_line_chars: int = 30
    # Gopher repetition.
    max_duplicate_line_fraction: float = 0.3
    max_duplicate_line_char_fraction: float = 0.2
    max_duplicate_paragraph_fraction: float = 0.3
    max_duplicate_paragraph_char_fraction: float = 0.2
    max_top_ngram_char_fraction: dict[int, float] = field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    max_duplicate_ngram_char_fraction: dict[int, float] = field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )
    # Code (The Stack, StarCoder).
    code_max_chars: int = 1_000_000
    code_min_lines: int = 5
    code_max_line_length: int = 1000
    code_max_mean_line_length: float = 100.0
    code_min_alphanumeric_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.min_words > self.max_words:
            raise ValueError(f"PrefilterConfig: min_words={self.min_words} > max_words={self.max_words}")
        if self.min_mean_word_length > self.max_mean_word_length:
            raise ValueError(
                f"PrefilterConfig: min_mean_word_length={self.min_mean_word_length} > "
                f"max_mean_word_length={self.max_mean_word_length}"
            )
        for name in ("max_top_ngram_char_fraction", "max_duplicate_ngram_char_fraction"):
            if any(n < 1 for n in getattr(self, name)):
                raise ValueError(
                    f"PrefilterConfig.{name}: n-gram sizes must be >= 1, got {getattr(self, name)}"
                )


def build_prefilters(config: PrefilterConfig, kind: str, languages: list[str] | None) -> list[DocumentFilter]:
    """The prefilters for one source, in the order they run.

    `kind`: "code", or the kind of text ("web", "reference", "math", "science", ...).
    `languages`: None skips language ID; [] keeps any language identified at `min_language_score`;
    ["en", ...] keeps only those fastText codes.
    """
    if kind == "code":
        if languages is not None:
            raise ValueError(
                f"build_prefilters: kind 'code' takes languages=None (fastText identifies natural "
                f"languages, not programming languages), got {languages}"
            )
        return [CodeFilter(config)]
    language_id = (
        []
        if languages is None
        else [LanguageFilter(languages=languages, min_score=config.min_language_score)]
    )
    return [*language_id, TextQualityFilter(config), RepetitionFilter(config)]
