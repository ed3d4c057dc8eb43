"""The n-gram language model and the per-source perplexity cut."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.data.filters import PrefilterConfig, build_prefilters, fit_to_source, run_filters
from moe_dag.data.filters.perplexity import NgramLanguageModel, PerplexityConfig, PerplexityFilter
from moe_dag.data.filters.prefilter import perplexity_filter

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
