"""A curation stage that drops every document of a language fails a blocking check (issue 20, item 4).

Before the fix, 14 of 75 languages of an any-language source lost every document at `prefiltered` and
nothing warned: the source as a whole kept 69%.
"""

from __future__ import annotations

import pyarrow as pa

from moe_dag.assets.reporting import LANGUAGES_KEPT
from moe_dag.curation.counts import language_counts
from moe_dag.operations.bounds import ChecksConfig, lost_languages
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake


def test_a_language_that_loses_every_document_is_named(tmp_path):
    lake = Lake(tmp_path)
    languages = ["en"] * 3 + ["th"] * 25 + [None] * 2 + ["de"] * 30 + ["und"] * 21 + ["hy"] * 20
    keep = [True] * 3 + [False] * 25 + [False] * 2 + [False] * 30 + [False] * 21 + [True] + [False] * 19
    reason = [None] * 3 + ["c4_too_few_sentences"] * 25 + ["document_too_long"] * 2
    reason += ["language_not_allowed"] * 30 + ["language_unidentified"] * 21 + [None] + ["x"] * 19
    table = pa.table({"id": [str(i) for i in range(len(keep))], "language": languages, "keep": keep})
    lake.write_table(table.append_column("reason", pa.array(reason, pa.string())), "prefiltered", "web")

    by_language = language_counts(lake, "prefiltered", "web")
    # Not counted: unidentified text (null, "und") and languages the source does not accept.
    assert by_language == {"en": (3, 3), "th": (25, 0), "hy": (20, 1)}
    (problem,) = lost_languages("prefiltered", "web", by_language, ChecksConfig())
    assert problem.startswith("prefiltered[web]: language 'th' lost all of its 25 documents")
    assert lost_languages("prefiltered", "web", by_language, ChecksConfig(min_language_documents=26)) == []
    assert lost_languages("prefiltered", "web", by_language, ChecksConfig(min_language_documents=0)) == []


def test_duplicates_do_not_count_as_a_lost_language(tmp_path):
    """A language whose documents all copy text kept elsewhere (the demo's English lines in `intl`, copies
    of `prose`) loses nothing at dedup: its text lives on in each cluster's survivor."""
    lake = Lake(tmp_path)
    reason = ["exact_duplicate"] * 20 + ["near_duplicate"] * 6 + [None] * 30
    table = pa.table(
        {
            "id": [str(i) for i in range(56)],
            "language": ["en"] * 26 + ["de"] * 30,
            "keep": [False] * 26 + [True] * 30,
            "reason": pa.array(reason, pa.string()),
        }
    )
    lake.write_table(table, "deduplicated", "intl")
    by_language = language_counts(lake, "deduplicated", "intl")
    assert by_language == {"de": (30, 30)}
    assert lost_languages("deduplicated", "intl", by_language, ChecksConfig()) == []


def test_a_stage_without_a_language_column_has_nothing_to_check(tmp_path):
    lake = Lake(tmp_path)
    lake.write_table(pa.table({"id": ["a"], "keep": [False], "reason": ["x"]}), "prefiltered", "code")
    assert language_counts(lake, "prefiltered", "code") == {}


def test_every_curation_stage_declares_the_blocking_language_check():
    graph = build_definitions("configs/demo.yaml").resolve_asset_graph()
    declared = {
        key.asset_key.to_user_string(): graph.get(key).blocking
        for key in graph.asset_check_keys
        if key.name == LANGUAGES_KEPT
    }
    stages = ("prefiltered", "deduplicated", "toxicity_filtered", "scored_documents")
    assert declared == dict.fromkeys(stages, True)
