"""The emptied-source and drop-share messages name, per top reason, the config key that governs it and
its value for the source (issue 21, defect 4: an operator had to guess which key would help)."""

from __future__ import annotations

import pytest
import yaml

from moe_dag.config import load_config
from moe_dag.curation.filters import PrefilterConfig, ToxicityConfig, build_prefilters, build_toxicity_filters
from moe_dag.operations.bounds import ChecksConfig, drop_share_violations, emptied_source


@pytest.fixture
def config(tmp_path):
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [
            {"name": "a", "kind": "reference", "shards": str(tmp_path / "a"), "languages": None},
            {
                "name": "b",
                "kind": "web",
                "shards": str(tmp_path / "b"),
                "languages": ["en"],
                "prefilter": {"gopher_quality": {"min_words": 80}},
            },
        ],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def test_the_emptied_source_message_names_each_top_reason_s_key_and_its_value(config):
    settings = config.reason_settings("prefiltered", "b")
    reasons = {"gopher_too_few_words": 100, "language_not_allowed": 7, "perplexity_too_high": 2}
    message = emptied_source("prefiltered", "b", reasons, 109, 0, settings)
    assert "gopher_too_few_words 100 (prefilter.gopher_quality.min_words = 80 for source b)" in message
    assert "language_not_allowed 7 (sources[b].languages = ['en'] for source b)" in message
    assert "perplexity_too_high 2 (prefilter.perplexity.high_percentile = 99.0 for source b)" in message
    # Source a keeps Gopher's own minimum: the value is the source's.
    assert config.reason_settings("prefiltered", "a")["gopher_too_few_words"].startswith(
        "prefilter.gopher_quality.min_words = 50 "
    )


def test_the_drop_share_message_names_the_reason_s_key_and_value(config):
    settings = config.reason_settings("toxicity_filtered", "a")
    (found,) = drop_share_violations(
        "toxicity_filtered", "a", {"toxic_lines": 6}, 10, ChecksConfig(), settings
    )
    assert "'toxic_lines' (toxicity.max_toxic_share = 0.1 for source a) dropped 6 of 10" in found
    repetition = config.reason_settings("prefiltered", "a")["gopher_top_2gram_chars"]
    assert repetition == "prefilter.gopher_repetition.max_top_ngram_char_fraction.2 = 0.2 for source a"


def test_every_reason_a_filter_can_give_is_mapped():
    """A new reason code must say which setting governs it (None where none does)."""
    filters = [
        *build_prefilters(PrefilterConfig(), "web", ["en"]),
        *build_prefilters(PrefilterConfig(), "code", None),
        *build_toxicity_filters(ToxicityConfig(), "web"),
    ]
    from moe_dag.operations.bounds import _STAGE_SETTINGS

    mapped = {
        reason
        for _, families in _STAGE_SETTINGS.values()
        for m in families.values()
        for reason in m.REASON_SETTINGS
    }
    assert {reason for f in filters for reason in f.reasons} <= mapped
