"""The comparison baselines: the dense twin's parameter count, the unfiltered documents kept free of the
evaluation set, and the paired gain of one run over another."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.mixture.unfiltered import unfiltered_documents
from moe_dag.training.baselines import dense_equivalent, dense_overrides
from moe_dag.training.compare import compare_runs
from moe_dag.training.config import apply_overrides, preset, tiny
from moe_dag.training.model import build_model
from moe_dag.training.params import count_parameters, parameter_formula


@pytest.mark.parametrize("name", ["tiny", "demo", "7b2a"])
def test_the_dense_twin_has_the_moe_models_active_parameters(name) -> None:
    moe = preset(name).model
    dense = dense_equivalent(moe)
    assert not any(dense.is_moe_layer(layer) for layer in range(dense.n_layers))
    moe_counts, dense_counts = parameter_formula(moe), parameter_formula(dense)
    assert dense_counts.total == dense_counts.active
    # Widths are whole numbers: at most 1.5 hidden units per layer away from an exact match.
    assert abs(dense_counts.active - moe_counts.active) <= 1.5 * 3 * moe.d_model * moe.n_layers
    assert dense_counts.active == pytest.approx(moe_counts.active, rel=0.01)


def test_dense_overrides_build_the_dense_twin_and_leave_a_dense_model_alone() -> None:
    config = tiny()
    overrides = [f"{key}={value}" for key, value in dense_overrides(config.model).items()]
    dense = apply_overrides(config, overrides).model
    model = build_model(dense, "meta")
    assert count_parameters(model, dense).active == parameter_formula(dense_equivalent(config.model)).active
    assert dense_equivalent(dense) == dense


def test_unfiltered_documents_leave_out_the_heldout_set_and_its_copies() -> None:
    raw = {
        "web": pa.table(
            {
                "id": ["w1", "w2", "w3", "w4"],
                "text": ["held out", "held out", "a near copy", "fine"],
                "other": [1, 2, 3, 4],
            }
        ),
        "code": pa.table({"id": ["c1", "c2"], "text": ["x = 1", "held out"]}),
    }
    clusters = pa.table({"id": ["w1", "w3", "w4", "c1"], "cluster_id": ["w1", "w1", "w4", "c1"]})
    kept, removed = unfiltered_documents(raw, {"w1"}, clusters)
    assert kept["web"]["id"].to_pylist() == ["w4"] and kept["web"].column_names == ["id", "text"]
    assert kept["code"]["id"].to_pylist() == ["c1"]
    assert removed == {"heldout": 1, "exact_copy": 2, "near_copy": 1}


def losses(nll: list[float], sources: list[str], ids: list[str], num_bytes: list[int]) -> pa.Table:
    tokens = [10] * len(nll)
    return pa.table({"source": sources, "id": ids, "nll_nats": nll, "tokens": tokens, "num_bytes": num_bytes})


def test_the_gain_is_the_baselines_bits_per_byte_minus_the_proxys_with_a_paired_interval() -> None:
    rng = np.random.default_rng(0)
    n = 80
    sources = ["a"] * 30 + ["b"] * 50
    ids = [f"d{i}" for i in range(n)]
    num_bytes = rng.integers(50, 500, size=n)
    difficulty = rng.lognormal(0.0, 0.5, size=n) * num_bytes * math.log(2)
    proxy = losses(list(0.9 * difficulty), sources, ids, list(num_bytes))
    baseline = losses(list(difficulty), sources, ids, list(num_bytes))
    # Row order does not matter: documents are matched by source and id.
    result = compare_runs(proxy, baseline.take(rng.permutation(n)))
    overall = result["overall"]
    expected_gain = 0.1 * difficulty.sum() / math.log(2) / num_bytes.sum()
    assert overall["gain"] == pytest.approx(expected_gain)
    assert overall["documents"] == n and 0 < overall["gain_ci"][0] < expected_gain < overall["gain_ci"][1]
    assert {source: figures["documents"] for source, figures in result["sources"].items()} == {
        "a": 30,
        "b": 50,
    }
    for figures in result["sources"].values():
        assert figures["gain"] == pytest.approx(
            figures["baseline_bits_per_byte"] - figures["proxy_bits_per_byte"]
        )


def test_runs_scored_on_different_documents_are_not_compared() -> None:
    proxy = losses([1.0, 2.0], ["a", "a"], ["d1", "d2"], [10, 10])
    with pytest.raises(ValueError, match="different held-out documents"):
        compare_runs(proxy, losses([1.0, 2.0], ["a", "a"], ["d1", "d3"], [10, 10]))
