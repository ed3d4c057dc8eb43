"""The perplexity cuts are fitted once per source and stored: a new shard is decided against them and
never moves an old document's decision; a refit is explicit (`prefilter.refit`) and says what it changed
(issue 21: a new shard used to refit the cuts, redo every shard and flip old decisions)."""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pytest
from test_dedup_backfill import pipeline_config, sentence_text, write_shard

from moe_dag.cli.main import main
from moe_dag.config import load_config
from moe_dag.curation.filters import build_prefilters
from moe_dag.curation.filters.perplexity import PerplexityFilter
from moe_dag.curation.fits import (
    change_counts,
    changed_decisions,
    decisions,
    fit_source,
    load_fit,
    refit_changes,
    store_fit,
    with_fit,
)
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake
from tests.pipeline_configs import edited_config

TEXTS = [
    f"Entry {i}: the river runs through the old town and past the mill number {i % 7}." for i in range(60)
]


def test_a_stored_fit_round_trips_and_its_version_is_its_content(tmp_path):
    lake = Lake(tmp_path / "lake")
    filters = [PerplexityFilter(low_percentile=10, high_percentile=90, min_documents=20)]
    batches = [pa.table({"text": TEXTS[:30]}), pa.table({"text": TEXTS[30:]})]
    fit = fit_source(filters, batches, 1000, "s1")
    assert fit.documents == 60 and fit.filters["perplexity"].cuts[0] < fit.filters["perplexity"].cuts[1]
    store_fit(lake, "prefiltered", "web", fit)
    loaded = load_fit(lake, "prefiltered", "web")
    assert (loaded.version, loaded.settings, loaded.documents) == (fit.version, "s1", 60)
    assert loaded.filters["perplexity"].cuts == fit.filters["perplexity"].cuts
    again = fit_source(
        [PerplexityFilter(low_percentile=10, high_percentile=90, min_documents=20)], batches, 1000, "s1"
    )
    assert again.version == fit.version  # the same data and settings: the same version, no shard redone
    other = fit_source(
        [PerplexityFilter(low_percentile=10, high_percentile=90, min_documents=20)], batches[:1], 1000, "s1"
    )
    assert other.version != fit.version
    assert load_fit(lake, "prefiltered", "other") is None
    with pytest.raises(ValueError, match="refit"):
        with_fit([PerplexityFilter(low_percentile=1, high_percentile=99)], fit_source([], [], 10, "s"))


def test_changed_decisions_name_each_change():
    before = pa.table({"id": ["a", "b", "c"], "keep": [True, False, True], "reason": [None, "x", None]})
    after = pa.table(
        {"id": ["a", "b", "c", "d"], "keep": [False, False, True, True], "reason": ["y", "x", None, None]}
    )
    changed = changed_decisions(before, after)
    assert changed.to_pylist() == [{"id": "a", "reason_before": "kept", "reason_after": "y"}]
    assert change_counts(changed) == {"kept -> y": 1}


def _config(tmp_path, corpus, refit: int = 0):
    changes = {
        "prefilter": {"perplexity": {"min_documents": 20, "low_percentile": 10, "high_percentile": 90}},
        "sources": {"a": {"prefilter": {"refit": refit}}},
        "checks": {"max_drop_share": {"default": 1.0}},  # the new shard's texts are shorter: not a defect
    }
    return edited_config(pipeline_config(tmp_path, corpus, "fits"), changes)


def _prefilter(config_path, instance) -> dict:
    definitions = build_definitions(config_path)
    dg.materialize(
        [*definitions.assets, *definitions.asset_checks],
        selection=["raw_documents", "prefiltered"],
        partition_key="a",
        instance=instance,
        resources=definitions.resources,
    )
    event = instance.get_latest_materialization_event(dg.AssetKey("prefiltered"))
    return {key: value.value for key, value in event.asset_materialization.metadata.items()}


@pytest.mark.slow
def test_a_new_shard_keeps_old_decisions_and_a_refit_says_what_it_changes(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    write_shard(corpus / "a", "shard-0", {f"a{i}": sentence_text(i) for i in range(40)})
    write_shard(corpus / "b", "shard-0", {"b0": sentence_text(99)})
    config_path = _config(tmp_path, corpus)
    instance = dg.DagsterInstance.ephemeral()
    first = _prefilter(config_path, instance)
    lake = Lake(load_config(config_path).lake_root)
    old = decisions(lake, "prefiltered", "a")
    assert first.get("decisions_changed", 0) == 0 and not all(old["keep"].to_pylist())  # the cuts drop some

    # Another vocabulary: fitted with it, the model and both percentiles would move.
    write_shard(corpus / "a", "shard-1", {f"n{i}": sentence_text(1000 + i, words=120) for i in range(40)})
    second = _prefilter(config_path, instance)
    assert second["shards_run"] == 1 and "decisions_changed" not in second  # only the new shard, no refit
    assert second["fit"]["version"] == first["fit"]["version"]
    assert changed_decisions(old, decisions(lake, "prefiltered", "a")).num_rows == 0

    # What a refit on both shards would change, asked before it is made...
    config = load_config(config_path)
    settings = config.prefilter_for(config.source("a"))
    filters = build_prefilters(settings, "reference", None)
    refitted = fit_source(
        filters, lake.iter_batches("raw_documents", "a"), 100_000, "the settings of a refit"
    )
    predicted = refit_changes(lake, "prefiltered", "a", with_fit(filters, refitted))
    assert predicted.num_rows > 0
    before = decisions(lake, "prefiltered", "a")
    assert main(["--config", str(config_path), "refit", "--source", "a"]) == 0
    said = capsys.readouterr().out
    assert f"{predicted.num_rows} stored decisions would change" in said
    assert "raise prefilter.refit (now 0) in sources[a].prefilter" in said
    assert decisions(lake, "prefiltered", "a").equals(before)  # the dry run wrote no decision

    # ...and made, by raising the source's `prefilter.refit`.
    third = _prefilter(_config(tmp_path, corpus, refit=1), instance)
    assert third["shards_run"] == 2 and third["fit"]["version"] != first["fit"]["version"]
    changed = changed_decisions(before, decisions(lake, "prefiltered", "a"))
    assert third["decisions_changed"] == changed.num_rows == predicted.num_rows
    assert third["decisions_changed_by_reason"] == change_counts(predicted)
    assert changed["id"].to_pylist() == predicted["id"].to_pylist()
