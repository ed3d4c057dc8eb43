"""Issue 35, item 2: a stored fit is data, never code. Whoever can write the lake could replace a pickled
fit with one that runs a command when `prefiltered` or `moe-dag refit` loads it; the fit is now JSON and
safetensors, and a file that is neither is refused with its path."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from moe_dag.curation.filters.perplexity import PerplexityFilter
from moe_dag.curation.fits import fit_source, load_fit, store_fit
from moe_dag.storage.lake import Lake

TEXTS = [
    f"Entry {i}: the river runs past the old mill number {i % 7} and the bridge {i % 3}." for i in range(60)
]


class _Planted:
    """What an attacker writes: unpickling it creates `marker` (a stand-in for any command)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _stored(tmp_path) -> tuple[Lake, object]:
    lake = Lake(tmp_path / "lake")
    filters = [PerplexityFilter(low_percentile=10, high_percentile=90, min_documents=20)]
    fit = fit_source(filters, [pa.table({"text": TEXTS})], 1000, "settings")
    store_fit(lake, "prefiltered", "web", fit)
    return lake, fit


def test_a_stored_fit_replaced_by_a_pickle_runs_nothing_and_is_refused_with_its_path(tmp_path):
    lake, _ = _stored(tmp_path)
    marker = tmp_path / "PWNED"
    folder = tmp_path / "lake" / "fits" / "prefiltered" / "source=web"
    planted = [path for path in folder.iterdir() if path.name != "current.json"]
    assert planted
    for path in planted:
        path.write_bytes(pickle.dumps(_Planted(str(marker))))
    with pytest.raises(
        ValueError, match=r"fits/prefiltered/source=web/\w+\.(json|safetensors): not a stored fit"
    ):
        load_fit(lake, "prefiltered", "web")
    assert not marker.exists()


def test_a_stored_fit_is_json_and_safetensors_and_decides_as_the_fit_it_came_from(tmp_path):
    lake, fit = _stored(tmp_path)
    folder = tmp_path / "lake" / "fits" / "prefiltered" / "source=web"
    assert sorted(path.suffix for path in folder.iterdir()) == [".json", ".json", ".safetensors"]
    loaded = load_fit(lake, "prefiltered", "web").filters["perplexity"]
    original = fit.filters["perplexity"]
    assert (loaded.cuts, loaded.language_cuts, loaded.low_percentile) == (
        original.cuts,
        original.language_cuts,
        original.low_percentile,
    )
    texts = [*TEXTS[:5], "zzqx vvbn unknown words entirely", ""]
    np.testing.assert_array_equal(loaded.score(texts)["perplexity"], original.score(texts)["perplexity"])
