"""The n-gram language model and the per-source perplexity cut."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.curation.filters import PrefilterConfig, build_prefilters, fit_to_source, run_filters
from moe_dag.curation.filters.perplexity import NgramLanguageModel, PerplexityConfig, PerplexityFilter, _words
from moe_dag.curation.filters.prefilter import perplexity_filter

SENTENCES = [
    "The river runs through the old town and past the mill.",
    "The baker opened the shutters and lit the oven before dawn.",
    "Children walked along the river on their way to school.",
    "In winter the river froze and the town came out to skate.",
    "The mill stood by the river for three hundred years.",
]


def test_model_probabilities_sum_to_one():
    model = NgramLanguageModel.fit(SENTENCES * 3, order=3, min_count=1)
    vocabulary = ["<unk>", *model.vocabulary]
    ids = np.array([0, 0, model.vocabulary["the"]])  # after "<s> <s> the", every next word
    total = 0.0
    for word_id in [1, *model.vocabulary.values()]:
        total += math.exp(model._log_probabilities(np.append(ids, word_id))[-1])
    assert len(vocabulary) == len(model.vocabulary) + 1
    assert total == pytest.approx(1.0, abs=1e-9)


def test_fluent_text_scores_lower_than_garbage():
    model = NgramLanguageModel.fit(SENTENCES * 3, order=3)
    fluent = model.perplexity("The river runs past the old mill.")
    shuffled = model.perplexity("mill old the past runs river The.")
    garbage = model.perplexity("Ã©tÃ© xq zzv 8823 qqq fjfj kkk")
    assert fluent < shuffled < garbage
    assert math.isnan(model.perplexity("   "))


def test_cut_at_percentiles_of_the_source():
    texts = [SENTENCES[i % 5] + f" Entry {i}." for i in range(200)]
    texts[7] = "Ã©tÃ© xq zzv 8823 qqq fjfj kkk wqq zzp"
    table = pa.table({"text": texts})
    out, stats = run_filters(table, [PerplexityFilter(low_percentile=1.0, high_percentile=99.0)])
    assert out["reason"][7].as_py() == "perplexity_too_high"
    # 1% at each end of 200 documents: at most two documents per tail (fewer where scores tie).
    dropped = stats.filters["perplexity"].dropped
    assert set(dropped) == {"perplexity_too_low", "perplexity_too_high"} and sum(dropped.values()) <= 4
    assert out["perplexity"].null_count == 0
    # The cut is over the whole source, not over each chunk run_filters streams.
    cut = PerplexityFilter(low_percentile=1.0, high_percentile=99.0)
    chunked, _ = run_filters(table, [cut], chunk_rows=16)
    assert chunked.equals(out)


def test_small_sources_are_not_cut():
    cut = PerplexityFilter(low_percentile=10.0, high_percentile=90.0, min_documents=100)
    out, _ = run_filters(pa.table({"text": SENTENCES}), [cut])
    assert all(out["keep"].to_pylist())


def test_reference_set_from_config(tmp_path):
    path = tmp_path / "reference.jsonl"
    path.write_text("".join(f'{{"text": "{s}"}}\n' for s in SENTENCES))
    config = PrefilterConfig(perplexity=PerplexityConfig(reference=str(path), min_documents=1))
    doc_filter = perplexity_filter(config.perplexity).fit(["The river runs past the mill."] * 3)
    assert doc_filter.model is not None and "river" in doc_filter.model.vocabulary
    with pytest.raises(ValueError, match="percentile"):
        PerplexityConfig(low_percentile=50, high_percentile=40)


def test_fitted_filter_pickles_for_a_worker():
    texts = [SENTENCES[i % 5] + f" Entry {i}." for i in range(120)]
    fitted = PerplexityFilter(low_percentile=1.0, high_percentile=99.0).fit(texts)
    copy = pickle.loads(pickle.dumps(fitted))
    assert copy.cuts == fitted.cuts
    assert copy.score(texts[:3])["perplexity"].tolist() == fitted.score(texts[:3])["perplexity"].tolist()


def test_fitted_once_per_source_then_every_batch_is_cut_alike():
    """Shards fan out over workers in batches: the cut is fitted on the source first, so a batch is
    decided against the source's percentiles, not its own."""
    texts = [SENTENCES[i % 5] + f" Entry {i}." for i in range(200)]
    texts[7] = "Ã©tÃ© xq zzv 8823 qqq fjfj kkk wqq zzp"
    table = pa.table({"text": texts})
    whole, _ = run_filters(table, [PerplexityFilter(low_percentile=1.0, high_percentile=99.0)])

    batches = [table.slice(start, 50) for start in range(0, 200, 50)]
    [fitted] = fit_to_source([PerplexityFilter(low_percentile=1.0, high_percentile=99.0)], batches, 10_000)
    worker_copy = pickle.loads(pickle.dumps(fitted))
    per_batch = pa.concat_tables([run_filters(batch, [worker_copy])[0] for batch in batches])
    assert per_batch.equals(whole)

    [from_sample] = fit_to_source([PerplexityFilter(low_percentile=1.0, high_percentile=99.0)], batches, 120)
    assert from_sample.cuts != fitted.cuts  # fitted on the first 120 documents only


def test_only_filters_that_cut_on_the_source_can_be_fitted():
    rule = build_prefilters(PrefilterConfig(), "web", None)[0]
    with pytest.raises(TypeError, match="nothing to fit"):
        rule.fit(["text"])


GERMAN = [
    "Der Fluss fließt durch die alte Stadt und an der Mühle vorbei.",
    "Der Bäcker öffnete die Läden und heizte den Ofen vor dem Morgengrauen.",
    "Kinder gingen auf dem Weg zur Schule am Fluss entlang.",
    "Im Winter fror der Fluss zu und die Stadt kam zum Schlittschuhlaufen.",
    "Die Mühle stand dreihundert Jahre lang am Fluss.",
]


def two_language_source() -> pa.Table:
    """150 English documents and 30 German ones, each German one with rarer words (a numbered entry
    spelt out differently every time), so German scores above English throughout."""
    english = [SENTENCES[i % 5] + f" Entry {i}." for i in range(150)]
    german = [f"{GERMAN[i % 5]} {GERMAN[(i + 2) % 5]} Eintrag{i}x{i * 7}q." for i in range(30)]
    return pa.table({"text": english + german, "language": ["en"] * 150 + ["de"] * 30})


def kept_share(out: pa.Table, language: str) -> float:
    rows = [
        keep
        for keep, lang in zip(out["keep"].to_pylist(), out["language"].to_pylist(), strict=True)
        if lang == language
    ]
    return sum(rows) / len(rows)


def test_each_language_is_cut_about_its_own_distribution():
    table = two_language_source()
    cut = PerplexityFilter(low_percentile=5.0, high_percentile=90.0)
    out, _ = run_filters(table, [cut])
    perplexity = np.array(out["perplexity"].to_pylist())
    assert perplexity[150:].min() > np.median(perplexity[:150])  # German scores above English

    # One cut over the pooled scores takes its upper tail from German.
    source_wide = PerplexityFilter(low_percentile=5.0, high_percentile=90.0)
    pooled, _ = run_filters(table.drop_columns(["language"]), [source_wide])
    assert source_wide.language_cuts == {}
    assert kept_share(pooled.append_column("language", table["language"]), "de") < 0.5

    # Per language, each loses about its own 15% of tails.
    assert set(cut.language_cuts) == {"en", "de"}
    assert out["perplexity_settings"].to_pylist() == table["language"].to_pylist()
    for language in ("en", "de"):
        assert 0.7 <= kept_share(out, language) <= 0.95, language
    assert json.loads(json.dumps(cut.language_cuts)) == {k: list(v) for k, v in cut.language_cuts.items()}


def test_languages_too_small_or_absent_take_the_source_wide_cut():
    table = two_language_source()
    few = PerplexityFilter(low_percentile=5.0, high_percentile=90.0, min_language_documents=31)
    out, _ = run_filters(table, [few])
    assert set(few.language_cuts) == {"en"} and out["perplexity_settings"].to_pylist()[150:] == [None] * 30

    # A source in one language gets exactly the cut over its own scores, as without language ID.
    english = table.slice(0, 150)
    with_language = PerplexityFilter(low_percentile=5.0, high_percentile=90.0)
    without = PerplexityFilter(low_percentile=5.0, high_percentile=90.0)
    decided, _ = run_filters(english, [with_language])
    plain, _ = run_filters(english.drop_columns(["language"]), [without])
    assert with_language.language_cuts == {} and with_language.cuts == without.cuts
    assert decided["keep"].equals(plain["keep"])

    # fit_to_source hands the filter the language column of the documents that reach it.
    [fitted] = fit_to_source([PerplexityFilter(low_percentile=5.0, high_percentile=90.0)], [table], 10_000)
    assert set(fitted.language_cuts) == {"en", "de"}


def test_unspaced_scripts_and_combining_marks_tokenise_into_words():
    # A Chinese clause is one `\w+` run and a Hindi word splits at its vowel signs under a plain `\w+`.
    assert _words("中文字。") == ["中", "文", "字", "。"]
    assert _words("हिन्दी भाषा, café") == ["हिन्दी", "भाषा", ",", "café"]
    assert _words("The river, 3 times.") == ["the", "river", ",", "3", "times", "."]
