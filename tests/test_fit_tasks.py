"""What the prefilter's fit costs the driver and the workers beyond its filters (issue 19): the function a
map of tasks runs (a partial that can carry the perplexity model) is pickled into Ray's object store
once, not once a task group; a worker keeps the language ID models of the filters it ran; and the fit
sample goes to tasks in pieces of whole row groups, so a sample in a few large shards still spreads."""

from __future__ import annotations

import pickle
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_dedup_backfill import sentence_text

from moe_dag.curation import fits
from moe_dag.curation.filters import PrefilterConfig, build_prefilters
from moe_dag.curation.filters.language import LanguageFilter
from moe_dag.curation.filters.perplexity import PerplexityConfig
from moe_dag.engine.tasks import iter_tasks, map_tasks
from moe_dag.storage.lake import Lake


class CountedPickles:
    """A callable that counts how often this process pickles it."""

    pickled = 0

    def __reduce__(self):
        CountedPickles.pickled += 1
        return (CountedPickles, ())

    def __call__(self, item: int) -> int:
        return item * 2


@pytest.mark.parametrize("run", [map_tasks, lambda fn, items: list(iter_tasks(fn, items))])
def test_the_function_of_a_map_is_shipped_once(local_ray, run):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
    CountedPickles.pickled = 0
    assert run(CountedPickles(), list(range(12))) == [2 * i for i in range(12)]
    assert CountedPickles.pickled == 1


def test_a_worker_reuses_the_filters_it_warmed_and_only_those():
    shipped = pickle.dumps([LanguageFilter(languages=["en"])])
    first = fits._warm(pickle.loads(shipped))
    first[0]._lid176("a sentence in English, long enough to be identified")  # loads lid.176
    again = fits._warm(pickle.loads(shipped))
    assert again is first and again[0]._fasttext is not None
    other = pickle.loads(pickle.dumps([LanguageFilter(languages=["de"])]))
    assert fits._warm(other) is other


def test_the_sample_is_cut_into_pieces_of_whole_row_groups(monkeypatch):
    monkeypatch.setattr(fits, "FIT_TASK_ROWS", 10)
    pieces = fits._pieces(["a", "b", "c"], [[4, 4, 4, 0], [25, 3], [5]], 39)
    assert [(p.path, p.groups, p.start, p.rows) for p in pieces] == [
        ("a", (0, 1), 0, 8),
        ("a", (2, 3), 8, 4),
        ("b", (0,), 0, 25),  # a group over the size is a piece of its own
        ("b", (1,), 25, 2),  # the sample ends inside it
    ]
    assert fits._pieces(["a", "b"], [[], [0]], 10) == []


@pytest.mark.parametrize("max_documents", [37, 100_000])
def test_the_fit_made_in_pieces_is_the_fit_made_here(tmp_path, monkeypatch, max_documents):
    """Files of several row groups, pieces smaller than a file, a sample that ends inside a group: the
    same model, cuts and version as the fit made in this process on the same rows."""
    monkeypatch.setattr(fits, "FIT_TASK_ROWS", 10)
    lake = Lake(tmp_path)
    for shard in range(3):
        ids = [f"web/{shard}-{i}" for i in range(23)]
        texts = [sentence_text(100 * shard + i, words=30 + 7 * i) for i in range(23)]
        texts[5] = "too short"  # dropped by the rules ahead of the perplexity filter
        path = lake.shard_path("raw_documents", "web", f"shard-{shard}")
        lake.fs.makedirs(lake.dataset_dir("raw_documents", "web"), exist_ok=True)
        with lake.fs.open(path, "wb") as handle:
            pq.write_table(pa.table({"id": ids, "text": texts}), handle, row_group_size=4)
    settings = PrefilterConfig(perplexity=PerplexityConfig(min_documents=10, reference_documents=20))

    def filters() -> list:
        return build_prefilters(settings, "web", None)

    here = fits.fit_source(filters(), lake.iter_batches("raw_documents", "web"), max_documents, "s")
    in_tasks = fits.fit_source_in_tasks(filters(), lake, "raw_documents", "web", max_documents, "s")
    assert in_tasks.documents == here.documents == min(max_documents, 69)
    assert in_tasks.describe() == here.describe() and in_tasks.version == here.version
    assert in_tasks.filters["perplexity"].model is not None
