"""The emptied-source and drop-share messages name, per top reason, the config key that governs it and
its value for the source (issue 21, defect 4: an operator had to guess which key would help)."""

from __future__ import annotations

import pytest
import yaml

from moe_dag.config import load_config
from moe_dag.curation.filters import PrefilterConfig, ToxicityConfig, build_prefilters, build_toxicity_filters
from moe_dag.operations.bounds import ChecksConfig, drop_share_violations, emptied_source
from moe_dag.training.strict_config import ConfigError


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
    assert "gopher_too_few_words 100 (sources[b].prefilter.gopher_quality.min_words = 80)" in message
    assert "language_not_allowed 7 (sources[b].languages = ['en'])" in message
    assert "perplexity_too_high 2 (sources[b].prefilter.perplexity.high_percentile = 99.0)" in message
    # Source b set min_words itself: no kind's defaults would change it, so the source's own key is named.
    assert message.endswith(
        "The pipeline stops here rather than train a mixture without it. To keep it: lower "
        "sources[b].prefilter.gopher_quality.min_words (80 now) for this source; or remove 'b' from sources"
    )
    # Source a keeps Gopher's own minimum: the value is the source's.
    assert str(config.reason_settings("prefiltered", "a")["gopher_too_few_words"]) == (
        "sources[a].prefilter.gopher_quality.min_words = 50"
    )


def test_the_drop_share_message_names_the_reason_s_key_and_value(config):
    settings = config.reason_settings("toxicity_filtered", "a")
    (found,) = drop_share_violations(
        "toxicity_filtered", "a", {"toxic_lines": 6}, 10, ChecksConfig(), settings
    )
    assert found == (
        "toxicity_filtered[a]: reason 'toxic_lines' (sources[a].toxicity.max_toxic_share = 0.1) dropped 6 of "
        "10 documents (60.0%), above its bound 50.0% (checks.max_drop_share, or "
        "checks.max_drop_share_by_source.a.toxic_lines). To keep more: raise "
        "sources[a].toxicity.max_toxic_share (0.1 now) for this source; if these drops are right: "
        "checks.max_drop_share_by_source.a.toxic_lines: 0.61"
    )
    repetition = config.reason_settings("prefiltered", "a")["gopher_top_2gram_chars"]
    assert str(repetition) == "sources[a].prefilter.gopher_repetition.max_top_ngram_char_fraction.2 = 0.2"


def test_tweets_declared_a_forum_are_told_of_kind_social_and_its_value(tmp_path):
    """Issue 34: tweets declared `kind: forum` stopped at `gopher_too_few_words` (68%) with no word of
    `kind: social`, whose defaults keep them."""
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [{"name": "tweets", "kind": "forum", "shards": str(tmp_path / "t"), "languages": ["en"]}],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    settings = load_config(path).reason_settings("prefiltered", "tweets")
    (found,) = drop_share_violations(
        "prefiltered", "tweets", {"gopher_too_few_words": 408}, 600, ChecksConfig(), settings
    )
    assert found == (
        "prefiltered[tweets]: reason 'gopher_too_few_words' "
        "(sources[tweets].prefilter.gopher_quality.min_words = 20) dropped 408 of 600 documents (68.0%), "
        "above its bound 50.0% (checks.max_drop_share, or "
        "checks.max_drop_share_by_source.tweets.gopher_too_few_words). To keep more: kind: social, whose "
        "defaults set it to 3, or sources[tweets].prefilter.gopher_quality.min_words: 3 for this source "
        "alone; if these drops are right: checks.max_drop_share_by_source.tweets.gopher_too_few_words: 0.69"
    )
    # A rule a looser kind does not run at all (social runs no C4 rules) names that kind with "off".
    c4 = settings["c4_too_few_sentences"]
    assert c4.looser_kinds == {"social": None}


def test_toxicity_is_set_per_source_over_the_section(tmp_path):
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "toxicity": {"max_toxic_share": 0.2},
        "sources": [
            {"name": "a", "kind": "web", "shards": str(tmp_path / "a"), "toxicity": {"max_toxic_share": 0.3}},
            {"name": "b", "kind": "web", "shards": str(tmp_path / "b")},
        ],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    assert config.toxicity_for(config.source("a")).max_toxic_share == 0.3
    assert config.toxicity_for(config.source("b")).max_toxic_share == 0.2
    raw["sources"][1]["toxicity"] = {"max_toxic_shar": 0.3}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"sources\[1\]\.toxicity\.max_toxic_shar"):
        load_config(path)


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
