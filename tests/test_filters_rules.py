"""Every heuristic rule at its threshold: a document just inside the limit and one just outside.

Documents are built from distinct made-up words ("word0 word1 ..."), so no rule fires but the one under
test; each family runs alone with the default config, which for these rules is the references' value.
"""

from __future__ import annotations

import pyarrow as pa

from moe_dag.curation.filters import PrefilterConfig, run_filters
from moe_dag.curation.filters.fineweb import FineWebConfig, FineWebQualityFilter
from moe_dag.curation.filters.gopher_quality import GopherQualityConfig, GopherQualityFilter
from moe_dag.curation.filters.gopher_repetition import GopherRepetitionConfig, GopherRepetitionFilter

CONFIG = PrefilterConfig()


def words(n: int, start: int = 0) -> str:
    """`n` distinct made-up words of 6 or 7 letters (the first two stop words when `start` is 0)."""
    names = [f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}rd{i // 676}" for i in range(start, start + n)]
    if n >= 2 and start == 0:
        names[0], names[1] = "the", "and"
    return " ".join(names)


def reason(doc_filter, text: str) -> str | None:
    out, _ = run_filters(pa.table({"text": [text]}), [doc_filter])
    return out["reason"][0].as_py()


def check(doc_filter, inside: str, outside: str, code: str) -> None:
    assert reason(doc_filter, inside) is None
    assert reason(doc_filter, outside) == code


# ---- Gopher quality ----------------------------------------------------------------------------

GOPHER = CONFIG.family_filter("gopher_quality")


def test_gopher_word_count_limits():
    check(GOPHER, words(50) + ".", words(49) + ".", "gopher_too_few_words")
    small = GopherQualityFilter(GopherQualityConfig(max_words=60))
    check(small, words(60) + ".", words(61) + ".", "gopher_too_many_words")


def test_gopher_mean_word_length_limits():
    short = " ".join(["the and"] * 25)  # 50 words of 3 letters: mean 3.0
    check(GOPHER, short + ".", short.replace("the", "an", 1) + ".", "gopher_mean_word_length_too_short")
    # 2 stop words of 3 letters, 34 words of 10 and 14 of 11: mean exactly 10.
    long = " ".join(["the", "and", *["abcdefghij"] * 34, *["abcdefghijk"] * 14])
    check(GOPHER, long + ".", long + "x.", "gopher_mean_word_length_too_long")


def test_gopher_symbol_ratios():
    # 50 words, a full stop and k hashtags ("#", "tag" tokens): 6/63 <= 0.1 < 7/65.
    base = words(50)
    check(GOPHER, base + " #tag" * 6 + ".", base + " #tag" * 7 + ".", "gopher_too_many_hashes")
    check(GOPHER, base + " so..." * 6 + ".", base + " so..." * 7 + ".", "gopher_too_many_ellipses")


def test_gopher_line_fractions():
    lines = [words(8, start=8 * i) + "." for i in range(10)]
    bullets = [f"- {line}" for line in lines]
    check(GOPHER, "\n".join(bullets[:9] + lines[9:]), "\n".join(bullets), "gopher_too_many_bullet_lines")
    trailing = [line[:-1] + "..." for line in lines]
    check(
        GOPHER,
        "\n".join(trailing[:3] + lines[3:]),
        "\n".join(trailing[:4] + lines[4:]),
        "gopher_too_many_ellipsis_lines",
    )


def test_gopher_alphabetic_word_fraction():
    # 50 words + "." + k numbers: 50/62 >= 0.8 > 50/63.
    base = words(50)
    check(GOPHER, base + " 1234" * 11 + ".", base + " 1234" * 12 + ".", "gopher_too_few_alphabetic_words")


def test_gopher_stop_words():
    check(GOPHER, words(50) + ".", words(50).replace("and ", "wand ", 1) + ".", "gopher_too_few_stop_words")


# ---- Gopher repetition -------------------------------------------------------------------------

REPETITION = GopherRepetitionFilter()
# A repeated paragraph or line also repeats its n-grams: its own limits are tested without those rules.
WHOLE_REPEATS = GopherRepetitionFilter(
    GopherRepetitionConfig(max_top_ngram_char_fraction={}, max_duplicate_ngram_char_fraction={})
)


def paragraphs(n: int) -> list[str]:
    return [words(40, start=40 * i) + "." for i in range(n)]


def test_duplicate_paragraph_fraction():
    # 7 long unique paragraphs and short repeats: 3 of 10 repeats is 0.3, 4 of 11 is over.
    unique = paragraphs(7)
    check(
        REPETITION,
        "\n\n".join(unique + ["Ok."] * 4),
        "\n\n".join(unique + ["Ok."] * 5),
        "gopher_duplicate_paragraphs",
    )


def test_duplicate_paragraph_char_fraction():
    unique = paragraphs(5)
    # One paragraph repeated: 1/6 of the characters, then 1/5 plus the paragraph breaks' share.
    check(
        WHOLE_REPEATS,
        "\n\n".join([*unique, unique[0]]),
        "\n\n".join([*unique[:3], unique[0]]),
        "gopher_duplicate_paragraph_chars",
    )


def test_duplicate_line_fraction_and_chars():
    unique = [words(40, start=40 * i) + "." for i in range(7)]
    check(
        REPETITION, "\n".join(unique + ["Ok."] * 4), "\n".join(unique + ["Ok."] * 5), "gopher_duplicate_lines"
    )
    lines = [words(40, start=40 * i) + "." for i in range(5)]
    check(
        WHOLE_REPEATS,
        "\n".join([*lines, lines[0]]),
        "\n".join([*lines[:3], lines[0]]),
        "gopher_duplicate_line_chars",
    )


def crossing(doc_filter, texts: list[str], column: str, limit: float, code: str) -> None:
    """Along `texts` (more and more repetitive), the first dropped text is the first whose score passes
    `limit`, and it drops for `code`."""
    scores = [doc_filter.score([text])[column][0] for text in texts]
    first_over = next(i for i, score in enumerate(scores) if score > limit)
    assert first_over > 0 and scores[first_over - 1] <= limit
    check(doc_filter, texts[first_over - 1], texts[first_over], code)


def test_top_ngram_fraction():
    only_top = GopherRepetitionFilter(
        GopherRepetitionConfig(max_top_ngram_char_fraction={2: 0.2}, max_duplicate_ngram_char_fraction={})
    )
    texts = [words(100) + " buy now" * k for k in range(1, 40)]
    crossing(only_top, texts, "gopher_top_2gram_char_fraction", 0.2, "gopher_top_2gram_chars")


def test_duplicate_ngram_fraction():
    only_five = GopherRepetitionFilter(
        GopherRepetitionConfig(max_top_ngram_char_fraction={}, max_duplicate_ngram_char_fraction={5: 0.15})
    )
    phrase = words(12, start=5000)
    texts = [words(300) + f" {phrase}" * k for k in range(1, 12)]
    crossing(only_five, texts, "gopher_duplicate_5gram_char_fraction", 0.15, "gopher_duplicate_5gram_chars")


def test_top_ngram_needs_a_repeat():
    """Defect from issue 10: with every n-gram occurring once, the top n-gram rule fired on short answers."""
    answer = "Use pathlib instead of os.path for this job."
    assert reason(REPETITION, answer) is None
    reference = PrefilterConfig.reference().family_filter("gopher_repetition")
    assert reason(reference, answer) == "gopher_top_2gram_chars"


# ---- C4 ----------------------------------------------------------------------------------------

C4 = CONFIG.family_filter("c4")


def sentence(i: int) -> str:
    return words(6, start=6 * i).capitalize() + "."


def test_c4_minimum_sentences():
    check(
        C4,
        " ".join(sentence(i) for i in range(5)),
        " ".join(sentence(i) for i in range(4)),
        "c4_too_few_sentences",
    )


def test_c4_line_rules_remove_lines_before_counting():
    five = [sentence(i) for i in range(5)]
    assert reason(C4, "\n".join(five)) is None
    # Each of these lines is removed, so its sentence no longer counts.
    for bad_line in (
        five[4][:-1],  # no terminal punctuation
        five[4][:-1] + "...",  # an ellipsis is not an end
        "Too short.",  # fewer than 3 words
        "Please enable javascript to view it.",
        "This site uses cookies to work.",
        five[4][:-1] + " " + "x" * 1001 + ".",  # a word over 1,000 characters
    ):
        assert reason(C4, "\n".join([*five[:4], bad_line])) == "c4_too_few_sentences", bad_line


def test_c4_citations_are_removed_first():
    five = [sentence(i) for i in range(5)]
    assert reason(C4, "\n".join([*five[:4], five[4] + "[12]"])) is None


def test_c4_page_rules():
    five = "\n".join(sentence(i) for i in range(5))
    assert reason(C4, five + "\nLorem ipsum dolor sit amet.") == "c4_lorem_ipsum"
    assert reason(C4, five + "\nThe map is {a: 1} here.") == "c4_curly_bracket"
    # Only kept lines count: a brace on a line removed for its missing full stop is ignored.
    assert reason(C4, five + "\nfunction f() { return 1 }") is None


# ---- FineWeb -----------------------------------------------------------------------------------

FINEWEB = CONFIG.family_filter("fineweb")


def lines(n: int, punctuated: int) -> list[str]:
    return [words(8, start=8 * i) + ("." if i < punctuated else "") for i in range(n)]


def test_fineweb_punctuated_line_fraction():
    check(FINEWEB, "\n".join(lines(25, 3)), "\n".join(lines(25, 2)), "fineweb_too_few_punctuated_lines")


def test_fineweb_short_line_fraction():
    long = lines(10, 10)
    short = [f"Item {i}." for i in range(30)]
    # 20 short of 30 lines is 0.667 <= 0.67; 21 of 31 is 0.677.
    check(FINEWEB, "\n".join(long + short[:20]), "\n".join(long + short[:21]), "fineweb_too_many_short_lines")


def test_fineweb_duplicate_line_chars():
    body = lines(40, 40)
    # One repeated 2-character line is under 1% of the characters; the first line repeated is over.
    check(
        FINEWEB, "\n".join([*body, "Ok", "Ok"]), "\n".join([*body, body[0]]), "fineweb_duplicate_line_chars"
    )


def test_fineweb_newline_ratio():
    text = words(30) + "."  # 31 tokens: 9 newlines is 0.29 per word, 10 is 0.32
    lists = FineWebQualityFilter(FineWebConfig(min_punctuated_line_fraction=0.0, max_short_line_fraction=1.0))
    check(lists, text.replace(" ", "\n", 9), text.replace(" ", "\n", 10), "fineweb_too_many_newlines")


def test_terminal_punctuation_is_script_aware():
    """Defect from issue 10: the Urdu (U+06D4) and Armenian (U+0589) full stops end a line."""
    urdu = "\n".join(
        ["یہ ایک جملہ ہے جو ختم ہوتا ہے۔"] * 1 + [f"یہ ایک اور لمبا جملہ نمبر {i} ہے۔" for i in range(4)]
    )
    armenian = "\n".join(f"Սա երկար նախադասություն է համար {i}։" for i in range(5))
    for text in (urdu, armenian):
        assert FINEWEB.score([text])["fineweb_punctuated_line_fraction"][0] == 1.0


def test_one_line_documents_skip_line_fraction_rules():
    """Defect from issue 10: a one-line answer without a final full stop scored 0 punctuated lines."""
    answer = " ".join(sentence(i) for i in range(6))[:-1]
    assert reason(FINEWEB, answer) is None
    assert reason(C4, answer) is None
    reference = PrefilterConfig.reference()
    assert reason(reference.family_filter("fineweb"), answer) == "fineweb_too_few_punctuated_lines"


def test_unspaced_scripts_count_letters_as_words():
    """Defect from issue 10: Chinese and Japanese failed the word count, Thai the mean word length."""
    chinese = "我们今天去学校学习数学和语文，老师讲得很清楚，同学们都认真听讲并且积极回答问题。" * 2
    thai = "วันนี้อากาศดีมากเราจึงไปเดินเล่นที่สวนสาธารณะใกล้บ้านและพบเพื่อนหลายคนที่นั่น " * 3
    for text in (chinese, thai):
        assert reason(GOPHER, text) is None, text
        assert reason(PrefilterConfig.reference().family_filter("gopher_quality"), text) is not None


def test_stop_words_apply_only_to_english_documents():
    german = " ".join(["Der Fluss fließt durch die alte Stadt und vorbei an der Mühle"] * 5) + "."
    out, _ = run_filters(pa.table({"text": [german], "language": ["de"]}), [GOPHER])
    assert out["reason"][0].as_py() is None
    out, _ = run_filters(pa.table({"text": [german], "language": ["en"]}), [GOPHER])
    assert out["reason"][0].as_py() == "gopher_too_few_stop_words"
