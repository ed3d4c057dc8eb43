"""Early-exit scoring against a full forward pass of the same backbone and heads."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from moe_dag.quality.heads import (
    BackboneConfig,
    JudgeHead,
    JudgeHeadConfig,
    ProbeHead,
    QualityHeads,
    Thresholds,
    heads_version,
    load_backbone,
)
from moe_dag.quality.oracle import GENERAL
from moe_dag.quality.scoring import (
    JUDGE_DROP,
    PROBE_EXIT,
    decision_changes,
    early_exit_summary,
    score_documents,
    split_reusable,
)
from moe_dag.storage.schema import reason_counts

TEXTS = [
    "Rivers carry sediment from the mountains to the sea, building deltas over thousands of years.",
    "buy now buy now buy now",
    "The derivative of a function measures how its output changes as its input changes.",
    "#### $$$$ @@@@",
    "In 1905 Einstein published four papers that changed physics.",
    "ok",
    "A hash table maps keys to values using a hash function to pick a bucket for each key.",
    "lorem ipsum dolor sit amet lorem ipsum dolor sit amet",
    "Bread rises because yeast ferments sugars and releases carbon dioxide into the dough.",
    "click here click here",
    "Tides are caused mainly by the gravitational pull of the moon on the oceans.",
]


@pytest.fixture(scope="module")
def setup():
    backbone = load_backbone(BackboneConfig(max_tokens=24, batch_size=4, probe_layer=3, judge_layer=6))
    torch.manual_seed(0)
    outputs = {"general": 5}
    heads = QualityHeads(
        ProbeHead(384, outputs), JudgeHead(384, JudgeHeadConfig(d_model=16, n_heads=2), outputs)
    )
    heads.eval()
    table = pa.table(
        {
            "id": [f"doc-{i}" for i in range(len(TEXTS))],
            "text": TEXTS,
            "source": ["web"] * len(TEXTS),
        }
    )
    return backbone, heads, table


def _full_forward(backbone, heads, texts):
    """Both heads' aggregates and the judge's dimensions on the model's own hidden states, no early exit."""
    ids, mask = backbone.tokenize(texts)
    with torch.no_grad():
        hidden = backbone.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        probe = heads.probe(hidden[backbone.config.probe_layer], mask, "general").double().numpy()
        judge = heads.judge(hidden[backbone.config.judge_layer], mask, "general").double().numpy()
    return heads.aggregate("general", probe), heads.aggregate("general", judge), judge


def _above_lowest(scores: np.ndarray, k: int) -> float:
    """Halfway between the k-th and the (k + 1)-th lowest score: batched and one-by-one forwards differ
    in the last bits, so a threshold must not sit on a score."""
    ranked = np.sort(scores)
    return float((ranked[k - 1] + ranked[k]) / 2)


def test_early_exit_matches_full_forward_and_accounts_for_every_row(setup):
    backbone, heads, table = setup
    probe_full, judge_full, judge_dimensions = _full_forward(backbone, heads, TEXTS)
    # Thresholds inside the score ranges, so both exits and both judge outcomes occur.
    thresholds = Thresholds(
        tau_drop=_above_lowest(probe_full, 4),
        tau_pass=_above_lowest(probe_full, 8),
        tau_keep=_above_lowest(judge_full, len(TEXTS) // 2),
    )
    assert thresholds.rubric == "general"
    judged_rows = []
    hook = heads.judge.register_forward_hook(lambda module, args, out: judged_rows.append(len(out)))
    try:
        scored = score_documents(table, backbone, heads, thresholds, batch_size=4)
    finally:
        hook.remove()

    assert scored["id"].to_pylist() == table["id"].to_pylist()
    dropped = np.asarray([r == PROBE_EXIT for r in scored["reason"].to_pylist()])
    assert dropped.sum() == (probe_full < thresholds.tau_drop).sum() == 4
    passed = probe_full >= thresholds.tau_pass
    assert passed.sum() == 3
    exited = dropped | passed
    judge = scored["judge_score"]
    assert judge.null_count == exited.sum()
    assert all(judge[i].as_py() is None for i in np.flatnonzero(exited))
    assert sum(judged_rows) == len(TEXTS) - exited.sum()  # the judge never saw an exited document

    np.testing.assert_allclose(scored["probe_score"].to_numpy(), probe_full, rtol=1e-5, atol=1e-5)
    stayed = ~exited
    judged = np.asarray([judge[i].as_py() for i in np.flatnonzero(stayed)])
    np.testing.assert_allclose(judged, judge_full[stayed], rtol=1e-5, atol=1e-5)
    for k, dim in enumerate(GENERAL.dimensions):  # every dimension is kept, null after an exit
        column = scored[f"judge_{dim}"]
        assert column.null_count == exited.sum()
        np.testing.assert_allclose(
            column.drop_null().to_numpy(), judge_dimensions[stayed, k], rtol=1e-5, atol=1e-5
        )

    keep = np.asarray(scored["keep"].to_pylist())
    np.testing.assert_array_equal(keep, passed | (stayed & (judge_full >= thresholds.tau_keep)))
    counts = reason_counts(scored)
    assert keep.sum() + sum(counts.values()) == table.num_rows
    assert set(counts) <= {PROBE_EXIT, JUDGE_DROP} and counts[PROBE_EXIT] == dropped.sum()
    assert pc.all(pc.equal(scored["heads_version"], heads_version(heads, backbone.config))).as_py()

    summary = early_exit_summary(scored, backbone.config)
    assert summary["early_exit_rate"] == exited.mean()
    assert (summary["drop_exit_rate"], summary["keep_exit_rate"]) == (dropped.mean(), passed.mean())
    assert summary["layer_compute_saved"] == pytest.approx(exited.mean() * 3 / 6)


def test_rescoring_replaces_old_columns(setup):
    backbone, heads, table = setup
    thresholds = Thresholds(tau_drop=0.0, tau_keep=0.0)  # nothing exits, everything is kept
    scored = score_documents(table, backbone, heads, thresholds, batch_size=8)
    assert scored["judge_score"].null_count == 0 and all(scored["keep"].to_pylist())
    again = score_documents(scored, backbone, heads, Thresholds(tau_drop=1.0, tau_keep=1.0), batch_size=8)
    assert again.column_names == scored.column_names
    assert set(again["reason"].to_pylist()) == {PROBE_EXIT} and again["judge_score"].null_count == len(TEXTS)
    empty = score_documents(table.slice(0, 0), backbone, heads, thresholds, batch_size=8)
    assert empty.num_rows == 0 and empty.column_names == scored.column_names


def test_a_rubric_the_heads_were_not_trained_for_is_refused(setup):
    backbone, heads, table = setup
    with pytest.raises(ValueError, match=r"trained for rubrics \['general'\], not 'code'"):
        score_documents(table, backbone, heads, Thresholds(tau_drop=0.0, tau_keep=0.5, rubric="code"), 8)


def test_rows_scored_by_the_current_heads_are_not_scored_again(setup):
    backbone, heads, table = setup
    version = heads_version(heads, backbone.config)
    no_exit = Thresholds(tau_drop=0.0, tau_keep=0.5)
    previous = score_documents(table.slice(0, 8), backbone, heads, no_exit, batch_size=8)
    edited = pa.table(
        {
            "id": table["id"],
            "text": table["text"].to_pylist()[:7] + ["an edited text"] + table["text"].to_pylist()[8:],
            "source": table["source"],
        }
    )
    reused, todo = split_reusable(edited, previous, version, no_exit)
    assert reused["id"].to_pylist() == [f"doc-{i}" for i in range(7)]  # doc-7 changed, 8-10 are new
    assert todo["id"].to_pylist() == [f"doc-{i}" for i in range(7, 11)]
    assert reused.column_names == previous.column_names

    stricter = Thresholds(tau_drop=0.0, tau_keep=1.0)  # new thresholds: decided again, not rescored
    reused, todo = split_reusable(table, previous, version, stricter)
    assert reused.num_rows == 8 and not any(reused["keep"].to_pylist())
    exits_everything = Thresholds(tau_drop=1.0, tau_keep=0.5)
    reused, _ = split_reusable(table, previous, version, exits_everything)
    assert set(reused["reason"].to_pylist()) == {PROBE_EXIT}

    exited = score_documents(table, backbone, heads, exits_everything, batch_size=8)
    reused, todo = split_reusable(table, exited, version, no_exit)  # now they need the judge they skipped
    assert reused.num_rows == 0 and todo.num_rows == table.num_rows
    keeps_everything = Thresholds(tau_drop=0.0, tau_keep=0.5, tau_pass=0.0)
    kept_at_probe = score_documents(table, backbone, heads, keeps_everything, batch_size=8)
    assert kept_at_probe["judge_score"].null_count == table.num_rows
    assert all(kept_at_probe["keep"].to_pylist())
    reused, todo = split_reusable(table, kept_at_probe, version, keeps_everything)
    assert reused.num_rows == table.num_rows and todo.num_rows == 0
    reused, todo = split_reusable(table, kept_at_probe, version, no_exit)
    assert reused.num_rows == 0 and todo.num_rows == table.num_rows
    reused, todo = split_reusable(table, previous, "another-version", no_exit)
    assert reused.num_rows == 0 and todo.num_rows == table.num_rows
    assert split_reusable(table, None, version, no_exit) == (None, table)


def test_a_shard_rescored_after_new_thresholds_reuses_its_rows(setup, tmp_path, monkeypatch):
    """New thresholds redo the shard (its record names them) but only re-decide rows the current heads
    scored: the backbone does not run again."""
    from moe_dag.engine import StageSpec
    from moe_dag.engine.run import run_stage
    from moe_dag.engine.shards import ShardInput
    from moe_dag.quality.heads import load_heads, save_heads
    from moe_dag.quality.work import ScoringWork
    from moe_dag.storage.lake import Lake

    backbone, heads, table = setup
    lake = Lake(tmp_path / "lake")
    upstream = lake.shard_path("toxicity_filtered", "web", "s0")
    lake.write_file(table, upstream)
    inputs = [ShardInput(key="s0", path=upstream, fingerprint="f0")]

    def score(tau_keep: float, heads_dir):
        thresholds = {"web": Thresholds(tau_drop=0.0, tau_keep=tau_keep)}
        save_heads(heads_dir, heads, thresholds, backbone.config, {})
        spec = StageSpec(
            outputs=("scored_documents",),
            make_work=lambda: ScoringWork(str(heads_dir), "web"),
            params=repr(thresholds),
        )
        return run_stage(spec, lake, "web", inputs, workers=0)

    first = score(0.5, tmp_path / "heads")
    assert first.shards_run == 1
    monkeypatch.setattr(
        "moe_dag.quality.work.ScoringWork.backbone", property(lambda self: pytest.fail("rescored"))
    )
    second = score(1.0, tmp_path / "heads")  # stricter: every row dropped, none scored again
    assert second.shards_run == 1 and second.counts["kept"] == 0
    assert second.counts["documents"] == first.counts["documents"] == table.num_rows
    # Issue 34, item 6: the old decisions decided again, and those that changed, are counted with why.
    why = f"new thresholds for heads {load_heads(tmp_path / 'heads').version}"
    assert "decided_again" not in first.counts and first.counts["kept"] > 0
    assert second.counts["decided_again"] == {why: table.num_rows}
    assert second.counts["decisions_changed"] == {why: first.counts["kept"]}
    assert second.counts_run == second.counts and second.keys_run == ("s0",)


def test_old_decisions_decided_again_are_counted_by_why_they_were():
    """Issue 34, item 6: what the summary reports of a rescoring, counted per shard against its output."""
    previous = pa.table(
        {"id": ["a", "b", "c"], "keep": [True, False, True], "heads_version": ["v1", "v1", "v2"]}
    )
    decided = pa.table({"id": ["a", "b", "c", "d"], "keep": [False, False, True, True]})
    assert decision_changes(previous, decided, "v2") == {
        "decided_again": {"heads v1 -> v2": 2, "new thresholds for heads v2": 1},
        "decisions_changed": {"heads v1 -> v2": 1, "new thresholds for heads v2": 0},
    }
    assert decision_changes(None, decided, "v2") == {}
