"""`kind: reference` on real reference text (issue 34, item 5).

Encyclopedia dumps reach moe-dag in two forms the web-page rules misread. A tokenised dump (WikiText's)
writes every word outside its vocabulary as `<unk>`, which datatrove's words split into `<`, `unk`, `>`: two
punctuation tokens per unknown word against Gopher's alphabetic-word share. Serbian Wikipedia writes Latin
names inside Cyrillic text as `-{...}-` (language-variant markup: not to be transliterated), and C4 drops a
page for any curly bracket in a kept line. Both readings are datatrove's, so the fixes are settings that
`kind: reference` turns on; the shared rules and `PrefilterConfig.reference()` stay as datatrove decides.

The text is real: Python's reference manual (`pydoc_data` topics) and the standard library's module
docstrings, rendered as a tokenised dump the way WikiText-103 was made (tokens split by spaces, words seen
fewer than 3 times replaced by `<unk>`), and Serbian translators' sentences from the machine's catalogues
(tests/fixtures/multilingual/serbian_articles.jsonl.gz) with their Latin names marked as Serbian
Wikipedia marks them.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path
from pydoc_data.topics import topics

import pyarrow as pa
import pytest

from moe_dag.curation.filters import PrefilterConfig, run_filters
from moe_dag.curation.filters.c4 import C4Config, C4QualityFilter
from moe_dag.curation.filters.gopher_quality import GopherQualityConfig, GopherQualityFilter
from moe_dag.curation.filters.reference import stdlib_docstrings
from moe_dag.curation.filters.text import split_words
from tests.kinds_corpus import MIN_WORDS, package_descriptions

SERBIAN = Path(__file__).parent / "fixtures" / "multilingual" / "serbian_articles.jsonl.gz"
WIKITEXT_MIN_COUNT = 3  # WikiText-103 kept words seen at least 3 times; the rest became <unk>
LATIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9.+-]*[A-Za-z0-9]")


def reference_articles() -> list[str]:
    """The reference manual's topics and the standard library's module docstrings of 50 words or more."""
    texts = [topic.strip() for topic in topics.values()] + stdlib_docstrings()
    return sorted({text for text in texts if len(text.split()) >= 50})


def tokenised_dump(texts: list[str]) -> list[str]:
    """`texts` as WikiText-103 stores articles: tokens split by spaces, a hyphen between words as `@-@`,
    each token seen fewer than WIKITEXT_MIN_COUNT times in all of them replaced by `<unk>`."""
    lines = [
        [" ".join("@-@" if word == "-" else word for word in split_words(line)) for line in text.splitlines()]
        for text in texts
    ]
    counts = collections.Counter(word for text in lines for line in text for word in line.split())
    return [
        "\n".join(
            " ".join(word if counts[word] >= WIKITEXT_MIN_COUNT else "<unk>" for word in line.split())
            for line in text
        )
        for text in lines
    ]


def kept(doc_filter, texts: list[str]) -> list[bool]:
    table, _ = run_filters(pa.table({"text": texts}), [doc_filter])
    return table["keep"].to_pylist()


@pytest.fixture(scope="module")
def dumped_clean_articles() -> list[str]:
    """The tokenised dump (its vocabulary drawn from every reference article) of the articles the
    web-page Gopher quality rule keeps as they are."""
    articles = reference_articles()
    web = PrefilterConfig().family_filter("gopher_quality")
    dump = tokenised_dump(articles)
    return [dumped for dumped, keep in zip(dump, kept(web, articles), strict=True) if keep]


def test_unknown_word_markers_count_as_words_for_kind_reference(dumped_clean_articles):
    dump = dumped_clean_articles
    assert len(dump) >= 15
    tokens = sum(len(text.split()) for text in dump)
    assert sum(text.split().count("<unk>") for text in dump) >= 0.03 * tokens  # the markers are there
    web = kept(PrefilterConfig().family_filter("gopher_quality"), dump)
    reference = kept(PrefilterConfig().for_kind("reference").family_filter("gopher_quality"), dump)
    # Measured: 20 of the 142 articles pass as they are; tokenised, 459 of their 4,833 tokens are <unk>, and
    # the median alphabetic share falls from 0.828 to 0.707 (web defaults: 1 kept, 19 dropped for it) or
    # stays at 0.829 (kind: reference: all 20 kept).
    assert sum(web) <= len(dump) // 4
    assert sum(reference) == len(dump)


def test_a_marker_is_one_alphabetic_word():
    own = GopherQualityFilter(GopherQualityConfig(word_placeholders=("<unk>",)))
    datatrove = GopherQualityFilter()
    text = "The <unk> of the river was <unk> in 1850 ."
    assert own.score([text])["gopher_alphabetic_word_fraction"][0] == pytest.approx(8 / 10)
    assert datatrove.score([text])["gopher_alphabetic_word_fraction"][0] == pytest.approx(8 / 14)
    assert own.score([text])["gopher_word_count"][0] == 9


def test_the_reference_configuration_reads_markers_as_datatrove_does():
    assert PrefilterConfig.reference().for_kind("reference").gopher_quality.word_placeholders == ()
    assert PrefilterConfig().gopher_quality.word_placeholders == ()


def serbian_articles() -> list[str]:
    with gzip.open(SERBIAN, "rt", encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines]


def test_serbian_latin_names_in_variant_markup_pass_c4_for_kind_reference():
    articles = [LATIN_NAME.sub(lambda name: "-{" + name[0] + "}-", text) for text in serbian_articles()]
    assert len(articles) >= 40 and all("-{" in text for text in articles)
    web = C4QualityFilter(PrefilterConfig().c4)
    reference = C4QualityFilter(PrefilterConfig().for_kind("reference").c4)
    web_reasons = collections.Counter(table_reasons(web, articles))
    reference_reasons = collections.Counter(table_reasons(reference, articles))
    # Measured: the web defaults drop all 45 articles as c4_curly_bracket, kind: reference keeps all 45,
    # as both keep the 45 without the markup.
    assert web_reasons == {"c4_curly_bracket": len(articles)}
    assert reference_reasons == {None: len(articles)}
    # The unmarked articles are decided alike: the markup, not the text, was what the rule read.
    plain = serbian_articles()
    assert table_reasons(reference, plain) == table_reasons(web, plain)


def test_a_curly_bracket_outside_variant_markup_still_drops_the_page():
    reference = C4QualityFilter(C4Config(language_variant_markup=True))
    page = "\n".join(
        ["Функција враћа вредност.", "Позив је f(x) { return x; } у језику -{C}-.", *["Ово је реченица."] * 5]
    )
    assert table_reasons(reference, [page]) == ["c4_curly_bracket"]
    assert table_reasons(reference, [page.replace("f(x) { return x; }", "f(x)")]) == [None]


def test_a_three_sentence_article_is_whole_for_kind_reference():
    article = (
        "Zlib is a library implementing the deflate compression method found in gzip and PKZIP. It is "
        "written in portable C and is used by a great many programs for reading and writing compressed data. "
        "Its format is described in RFC 1950, and the deflate method itself in RFC 1951."
    )
    assert table_reasons(C4QualityFilter(PrefilterConfig().c4), [article]) == ["c4_too_few_sentences"]
    assert table_reasons(C4QualityFilter(PrefilterConfig().for_kind("reference").c4), [article]) == [None]


def test_short_catalogue_articles_pass_c4_for_kind_reference():
    """Debian's package descriptions: a third-person article a subject, as packages.debian.org shows them."""
    articles = sorted({text for text in package_descriptions() if len(text.split()) >= MIN_WORDS})
    assert len(articles) >= 100
    web = collections.Counter(table_reasons(C4QualityFilter(PrefilterConfig().c4), articles))
    reference = C4QualityFilter(PrefilterConfig().for_kind("reference").c4)
    reference_reasons = collections.Counter(table_reasons(reference, articles))
    # Measured on 322: the web defaults' five sentences drop 230, kind: reference's three 59 (articles of one
    # or two sentences and a list, 13 of them the libxcb libraries' near-identical entries); no other reason.
    assert web["c4_too_few_sentences"] >= 0.6 * len(articles)
    assert reference_reasons["c4_too_few_sentences"] <= 0.25 * len(articles)
    assert set(reference_reasons) <= {None, "c4_too_few_sentences"}


def table_reasons(doc_filter, texts: list[str]) -> list[str | None]:
    table, _ = run_filters(pa.table({"text": texts}), [doc_filter])
    return table["reason"].to_pylist()
