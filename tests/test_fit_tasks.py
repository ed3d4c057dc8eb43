"""What the prefilter's fit costs the driver and the workers beyond its filters (issue 19): the function a
map of tasks runs (a partial that can carry the perplexity model) is pickled into Ray's object store
once, not once a task group, and a worker keeps the language ID models of the filters it ran."""

from __future__ import annotations

import pickle
import sys

import pytest

from moe_dag.data import fits
from moe_dag.data.filters.language import LanguageFilter
from moe_dag.data.tasks import iter_tasks, map_tasks


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
