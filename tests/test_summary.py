"""`moe-dag summary` after partial runs: what exists is reported, what does not is named, no traceback."""

import duckdb
import pyarrow as pa
import yaml

from moe_dag.cli import main as cli
from moe_dag.cli.summary import format_summary, warning_findings
from moe_dag.config import load_config


def write_config(tmp_path):
    path = tmp_path / "pipeline.yaml"
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "catalog.duckdb"),
        "sources": [
            {"name": "web", "kind": "web", "shards": str(tmp_path)},
            {"name": "social", "kind": "forum", "shards": str(tmp_path)},
        ],
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def test_summary_of_nothing_materialised_names_what_is_missing(tmp_path, capsys):
    path = write_config(tmp_path)
    assert cli.main(["--config", str(path), "summary"]) == 0
    out = capsys.readouterr().out
    for section in ["documents per stage", "duplicates", "quality heads", "mixture", "proxy evaluation"]:
        assert f"{section}: not materialised yet" in out
    assert "Traceback" not in out


def test_summary_reports_a_source_that_lost_every_document(tmp_path):
    path = write_config(tmp_path)
    (tmp_path / "lake").mkdir()
    with duckdb.connect(str(tmp_path / "catalog.duckdb")) as con:
        con.execute(
            "CREATE TABLE stage_funnel AS SELECT * FROM (VALUES "
            "('raw_documents', 'web', 5, 5, 0), ('prefiltered', 'web', 5, 3, 2), "
            "('raw_documents', 'social', 4, 4, 0), ('prefiltered', 'social', 4, 0, 4)) "
            "t(stage, source, rows_in, kept, dropped)"
        )
        con.execute("CREATE TABLE quarantine AS SELECT 'web' AS source WHERE false")
    summary = format_summary(load_config(path))
    lines = summary.splitlines()
    assert any(line.startswith("prefiltered") and line.split()[1:] == ["3", "0"] for line in lines)
    assert any(line.startswith("deduplicated") and line.split()[1:] == ["0", "0"] for line in lines)
    assert "source 'social' lost every document at prefiltered" in summary
    assert "source 'web' lost" not in summary
    assert "mixture: not materialised yet (needs tokenized_mixture)" in summary


def test_catalog_and_summary_report_the_kept_share_of_each_language(tmp_path):
    """Issue 20: a source could keep 69% while whole languages of it vanished, and nothing showed it."""
    from moe_dag.storage.catalog import Catalog
    from moe_dag.storage.lake import Lake

    path = write_config(tmp_path)
    lake = Lake(tmp_path / "lake")
    languages = ["en"] * 10 + ["el"] * 10 + [None] * 2
    ids = [f"d{i}" for i in range(len(languages))]
    # Two more: one in a language the source does not accept, one duplicate. Neither counts as a loss.
    languages += ["fr", "en"]
    ids = [f"d{i}" for i in range(len(languages))]
    web = ["web"] * len(ids)
    prefilter_reasons = [None] * 22 + ["language_not_allowed", None]
    prefiltered = pa.table(
        {"id": ids, "source": web, "language": languages, "keep": [True] * 22 + [False, True]}
    ).append_column("reason", pa.array(prefilter_reasons, pa.string()))
    dedup_reasons = pa.array([None] * 23 + ["exact_duplicate"], pa.string())
    deduplicated = pa.table({"id": ids, "source": web, "keep": [True] * 23 + [False]})
    kept = [i < 7 for i in range(10)] + [False] * 10 + [True] * 2 + [False, False]
    scored = pa.table({"id": ids, "source": web, "keep": kept})
    lake.write_table(prefiltered, "prefiltered", "web")
    lake.write_table(deduplicated.append_column("reason", dedup_reasons), "deduplicated", "web")
    lake.write_table(scored, "scored_documents", "web")
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    catalog.refresh({"prefiltered": True, "deduplicated": True, "scored_documents": True})
    rows = catalog.write_language_funnel()
    assert rows == [("web", "el", 10, 0, 0.0), ("web", "en", 10, 7, 0.7), ("web", "und", 2, 2, 1.0)]

    summary = format_summary(load_config(path))
    assert "kept share per language in 'web': 0.35 over 2 languages" in summary
    assert "el 0.00* (0/10)  en 0.70* (7/10)" in summary
    assert "lost every document: el" in summary


def test_small_samples_and_shares_off_target_are_warnings_naming_their_keys(tmp_path):
    """Issue 34, item 4: the warning checks' sentences, read back from the stages' own records."""
    import json

    from moe_dag.storage.catalog import Catalog
    from moe_dag.storage.lake import Lake

    path = write_config(tmp_path)
    lake = Lake(tmp_path / "lake")
    (lake.artifact_dir("quality_heads") / "heads.json").write_text(
        json.dumps({"thresholds": {"web": {"n_calibration": 7, "n_needed": 897}}})
    )
    shares = {
        "web": {"achieved_share": 0.986, "target_share": 0.5, "short": False},
        "social": {"achieved_share": 0.014, "target_share": 0.5, "short": True},
    }
    (lake.artifact_dir("tokenized_mixture") / "mixture.json").write_text(json.dumps({"sources": shares}))
    with duckdb.connect(str(tmp_path / "catalog.duckdb")) as con:
        con.execute(
            "CREATE TABLE stage_funnel AS SELECT * FROM (VALUES ('scored_documents', 'web', 31, 16, 15), "
            "('scored_documents', 'social', 10, 7, 3)) t(stage, source, rows_in, kept, dropped)"
        )
    # The summary prints these lines after its sections (here heads.json holds only its thresholds).
    summary = warning_findings(load_config(path), lake, Catalog(tmp_path / "catalog.duckdb", lake))
    assert summary == [
        "warnings (asset checks of warning severity):",
        "  calibrated_on_enough_documents: quality_heads[social]: no unseen documents to calibrate on, so no "
        "thresholds and it cannot be scored: the source needs more documents than the oracle labels "
        "(oracle.per_source)",
        "  calibrated_on_enough_documents: quality_heads[web]: thresholds calibrated on 7 unseen documents, "
        "fewer than the 897 that a keep rate within calibration.keep_rate_tolerance 0.03 needs (z = 1.96): "
        "on new documents its keep rate may be 0.339 off its target; calibration.keep_rate_tolerance: 0.339 "
        "accepts that, or the source needs more documents than the oracle labels (oracle.per_source)",
        "  keep_rate_on_target: scored_documents[web]: kept 16 of 31 documents (0.5161), 0.1839 from its "
        "target keep rate 0.7 (sources[web].keep_rate), beyond calibration.keep_rate_tolerance 0.03",
        "  target_shares_met: source 'social': achieved share 0.0140 against target 0.5000 (error 0.4860 > "
        "checks.max_share_error 0.02); sources[social].mixture_weight sets the target",
        "  target_shares_met: source 'web': achieved share 0.9860 against target 0.5000 (error 0.4860 > "
        "checks.max_share_error 0.02); sources[web].mixture_weight sets the target",
        "  sources_within_epoch_cap: tokenized_mixture: source 'social' is at its cap of 4 epochs and trains "
        "at 0.0140 of the mixture against its target 0.5000: raise mixture.max_epochs, lower "
        "sources[social].mixture_weight, or give the source more documents",
    ]


def test_other_languages_in_a_one_language_source_are_language_id_disagreements(tmp_path):
    from moe_dag.storage.catalog import Catalog
    from moe_dag.storage.lake import Lake

    path = tmp_path / "pipeline.yaml"
    source = {"name": "tweets", "kind": "social", "shards": str(tmp_path), "languages": ["en"]}
    raw = {
        "lake_root": str(tmp_path / "lake"),
        "catalog_path": str(tmp_path / "c.duckdb"),
        "sources": [source],
    }
    path.write_text(yaml.safe_dump(raw))
    lake = Lake(tmp_path / "lake")
    languages = ["en"] * 10 + ["it", "it", "id", "lb"]
    ids = [f"d{i}" for i in range(len(languages))]
    keep = [True] * 10 + [True, False, False, False]
    for stage in ("prefiltered", "deduplicated", "scored_documents"):
        table = pa.table({"id": ids, "source": ["tweets"] * len(ids), "language": languages, "keep": keep})
        lake.write_table(
            table.append_column("reason", pa.array([None] * len(ids), pa.string())), stage, "tweets"
        )
    catalog = Catalog(tmp_path / "c.duckdb", lake)
    catalog.refresh({"prefiltered": True, "deduplicated": True, "scored_documents": True})
    catalog.write_language_funnel()
    summary = format_summary(load_config(path))
    assert "lost every document" not in summary and "kept share per language in 'tweets'" not in summary
    assert (
        "language ID disagreements in 'tweets' (declared en): 4 documents named another language "
        "(it 2, id 1, lb 1), 1 of them kept" in summary
    )


def test_the_summary_says_how_many_old_decisions_changed_and_why(tmp_path):
    """Issue 34, item 6: a rescoring that changed old decisions says so, per source and by why, from the
    completion records of scored_documents (each shard's last scoring)."""
    from moe_dag.cli.summary import old_decisions
    from moe_dag.storage.lake import Lake

    config = load_config(write_config(tmp_path))
    lake = Lake(config.lake_root)
    assert old_decisions(config, lake) == []  # nothing scored yet
    heads, thresholds = "heads v1 -> v2", "new thresholds for heads v2"
    counts = {
        ("web", "s0"): {"decided_again": {heads: 200}, "decisions_changed": {heads: 30}},
        ("web", "s1"): {"decided_again": {thresholds: 50}, "decisions_changed": {thresholds: 10}},
        ("web", "s2"): {"documents": 40},  # a new shard: its documents were decided once
        ("social", "s0"): {"decided_again": {heads: 100}, "decisions_changed": {heads: 5}},
    }
    for (source, key), shard_counts in counts.items():
        lake.write_record("scored_documents", source, key, {"counts": shard_counts})
    assert old_decisions(config, lake) == [
        "old scoring decisions changed when their shards were last scored: 45 of 350 decided again "
        "(web 40 of 250, social 5 of 100); why: heads v1 -> v2 35 of 300, "
        "new thresholds for heads v2 10 of 50"
    ]
    for source, key in counts:
        lake.write_record("scored_documents", source, key, {"counts": {"documents": 1}})
    assert old_decisions(config, lake) == [
        "old scoring decisions changed: none (every scored document was decided once, by the current heads)"
    ]
