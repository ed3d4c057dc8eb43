"""Thresholds per language group inside a multilingual source (issue 20, item 2).

Before the fix one threshold per source let heads that read Latin script well and other scripts badly
keep 89% of Latin-script documents and 5% of the rest; on the multilingual fixture Greek, Bengali and
Malayalam went to zero, Korean and Telugu to one document each.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moe_dag.quality.heads.thresholds import (
    CalibrationConfig,
    Thresholds,
    allowed_changes,
    calibrate_source,
    dominant_script,
)
from moe_dag.quality.scoring import decide

KEEP_RATE = 0.7
TEXTS = {
    "en": "The library opens at nine.",
    "de": "Die Bibliothek öffnet um neun.",
    "fr": "La bibliothèque ouvre à neuf heures.",
    "el": "Η βιβλιοθήκη ανοίγει στις εννέα.",
    "ko": "도서관은 아홉 시에 엽니다.",
}


def two_scripts(n: int = 200) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Judge scores the heads give: English well above Greek, each spread within its language."""
    rng = np.random.default_rng(0)
    english, greek = rng.uniform(0.5, 0.9, n), rng.uniform(0.1, 0.45, n)
    judge = np.concatenate([english, greek])
    return judge, judge + rng.normal(0, 0.02, 2 * n), ["en"] * n + ["el"] * n


def calibrate(probe, judge, languages, config: CalibrationConfig | None = None) -> Thresholds:
    texts = [TEXTS[language] for language in languages]
    return calibrate_source(
        probe, judge, KEEP_RATE, config or CalibrationConfig(), "general", languages, texts
    )


def kept_share(thresholds: Thresholds, probe, judge, languages, language: str) -> float:
    keep, _ = decide(probe, judge, thresholds, languages)
    return float(np.mean([k for k, lang in zip(keep, languages, strict=True) if lang == language]))


def test_each_language_keeps_about_the_source_keep_rate():
    judge, probe, languages = two_scripts()
    config = CalibrationConfig(exit_z=0.0)
    pooled = calibrate(probe, judge, languages, dataclasses.replace(config, per_language=False))
    assert kept_share(pooled, probe, judge, languages, "el") < 0.45  # the defect: one cut erases Greek
    thresholds = calibrate(probe, judge, languages, config)
    assert set(thresholds.languages) == {"en", "el"}
    for language in ("en", "el"):
        assert kept_share(thresholds, probe, judge, languages, language) == pytest.approx(KEEP_RATE, abs=0.02)
    # A language the calibration did not see, or none, is decided by the source's thresholds.
    assert thresholds.for_language("ko") is thresholds and thresholds.for_language(None) is thresholds


def test_small_languages_pool_by_script_or_stand_alone():
    judge, probe, languages = two_scripts()
    languages[:10] = ["de"] * 10  # at least min_documents_per_language (5): its own
    languages[-4:] = ["ko"] * 4  # a script group under min_documents_per_script (5): calibrated alone
    thresholds = calibrate(probe, judge, languages)
    assert set(thresholds.languages) == {"en", "de", "el", "ko"}
    languages[-4:] = ["el"] * 3 + ["ko"]  # one document has no quantile: the source decides
    thresholds = calibrate(probe, judge, languages)
    assert set(thresholds.languages) == {"en", "de", "el"}
    assert thresholds.for_language("ko") is thresholds
    languages[10:200] = ["fr"] * 190
    pooled = calibrate(probe, judge, languages, CalibrationConfig(min_documents_per_language=200))
    assert pooled.languages["de"] == pooled.languages["fr"]  # one Latin group
    assert pooled.languages["el"] != pooled.languages["fr"]
    single = calibrate(probe, judge, ["en"] * len(judge))
    assert single.languages == {}


def test_thresholds_per_language_survive_a_json_round_trip():
    judge, probe, languages = two_scripts()
    thresholds = calibrate(probe, judge, languages)
    again = Thresholds(**dataclasses.asdict(thresholds))
    assert again == thresholds and isinstance(again.languages["el"], Thresholds)


def test_dominant_script_reads_the_letters():
    assert [dominant_script(TEXTS[k]) for k in ("en", "el", "ko")] == ["LATIN", "GREEK", "HANGUL"]
    assert dominant_script("12 + 34 = 46") == "NONE"


def test_a_small_language_also_calibrates_on_the_documents_the_heads_trained_on():
    """Malayalam on the multilingual fixture kept 0.45-0.82 of its documents against the source's 0.63,
    calibrated on the 4-6 the oracle sample left unseen: its group now uses the ones trained on too."""
    rng = np.random.default_rng(1)
    english = rng.uniform(0.5, 0.9, 200)
    malayalam = rng.uniform(0.1, 0.3, 12)
    judge = np.concatenate([english, malayalam])
    probe = judge + rng.normal(0, 0.02, len(judge))
    languages = ["en"] * 200 + ["ko"] * 12
    unseen = np.arange(len(judge)) < 204  # 4 of the small language's 12 are unseen
    config = CalibrationConfig(exit_z=0.0)
    texts = [TEXTS[language] for language in languages]
    thresholds = calibrate_source(probe, judge, KEEP_RATE, config, "general", languages, texts, unseen)
    assert thresholds.languages["ko"].n_calibration == 12
    assert kept_share(thresholds, probe, judge, languages, "ko") == pytest.approx(8 / 12)
    # The source's own thresholds come from the unseen documents alone.
    only_unseen = calibrate_source(
        probe[unseen], judge[unseen], KEEP_RATE, config, "general", languages[:204], texts[:204]
    )
    assert thresholds.tau_keep == only_unseen.tau_keep
    assert thresholds.n_calibration == 204


def test_language_groups_exit_on_offsets_calibrated_over_the_whole_source():
    """Fifty languages of 20 documents each, every one scored on its own level by both heads: no group
    alone could show that its exits change at most 1% of its decisions, so the exits come from offsets
    calibrated on all 1,000 documents (enough for the default bound: 3 overturned), each group's
    thresholds sitting at its own probe centre plus them."""
    rng = np.random.default_rng(2)
    levels = np.repeat(rng.uniform(0.2, 0.8, 50), 20)
    judge = levels + rng.uniform(-0.15, 0.15, len(levels))
    probe = judge + rng.normal(0, 0.01, len(judge))
    languages = [f"l{i // 20:02d}" for i in range(len(judge))]
    thresholds = calibrate_source(
        probe, judge, KEEP_RATE, CalibrationConfig(), "general", languages, [TEXTS["en"]] * len(judge)
    )
    assert len(thresholds.languages) == 50
    keep, _ = decide(probe, judge, thresholds, languages)
    judge_keep = thresholds.kept_by_judge(judge, languages)
    exits = thresholds.dropped_at_probe(probe, languages) | thresholds.kept_at_probe(probe, languages)
    assert exits.mean() > 0.4  # with the default 90% bound, which no 20-document group could pass alone
    assert np.sum(np.asarray(keep) != judge_keep) <= allowed_changes(len(judge), CalibrationConfig()) == 3
    for group in thresholds.languages.values():
        assert group.early_exit_rate > 0 and group.n_calibration == 20
