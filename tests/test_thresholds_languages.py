"""Thresholds per language inside a multilingual source (issue 20, item 2).

Before the fix one threshold per source let heads that read Latin script well and other scripts badly
keep 89% of Latin-script documents and 5% of the rest; Greek, Bengali, Korean and Malayalam went to zero
on the multilingual fixture.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moe_dag.data.heads.thresholds import CalibrationConfig, Thresholds, calibrate_source
from moe_dag.data.scoring import decide

KEEP_RATE = 0.7


def two_scripts(n: int = 200) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Judge scores the heads give: English well above Greek, each spread within its language."""
    rng = np.random.default_rng(0)
    english, greek = rng.uniform(0.5, 0.9, n), rng.uniform(0.1, 0.45, n)
    judge = np.concatenate([english, greek])
    return judge, judge + rng.normal(0, 0.02, 2 * n), ["en"] * n + ["el"] * n


def kept_share(thresholds: Thresholds, probe, judge, languages, language: str) -> float:
    keep, _ = decide(probe, judge, thresholds, languages)
    return float(np.mean([k for k, lang in zip(keep, languages, strict=True) if lang == language]))


def test_each_language_keeps_about_the_source_keep_rate():
    judge, probe, languages = two_scripts()
    config = CalibrationConfig(exit_z=0.0)
    pooled = calibrate_source(
        probe, judge, KEEP_RATE, dataclasses.replace(config, per_language=False), "general", languages
    )
    assert kept_share(pooled, probe, judge, languages, "el") < 0.45  # the defect: one cut erases Greek
    thresholds = calibrate_source(probe, judge, KEEP_RATE, config, "general", languages)
    assert set(thresholds.languages) == {"en", "el"}
    for language in ("en", "el"):
        assert kept_share(thresholds, probe, judge, languages, language) == pytest.approx(KEEP_RATE, abs=0.02)
    # A language the calibration did not see, or none, is decided by the source's thresholds.
    assert thresholds.for_language("ko") is thresholds and thresholds.for_language(None) is thresholds


def test_small_languages_fall_back_to_the_source_thresholds():
    judge, probe, languages = two_scripts()
    languages[-4:] = ["ko"] * 4  # under min_documents_per_language (5)
    thresholds = calibrate_source(probe, judge, KEEP_RATE, CalibrationConfig(), "general", languages)
    assert set(thresholds.languages) == {"en", "el"}
    single = calibrate_source(probe, judge, KEEP_RATE, CalibrationConfig(), "general", ["en"] * len(judge))
    assert single.languages == {}


def test_thresholds_per_language_survive_a_json_round_trip():
    judge, probe, languages = two_scripts()
    thresholds = calibrate_source(probe, judge, KEEP_RATE, CalibrationConfig(), "general", languages)
    again = Thresholds(**dataclasses.asdict(thresholds))
    assert again == thresholds and isinstance(again.languages["el"], Thresholds)
