"""Issue 35, item 9: `moe-dag search-mixture` trained every proxy, then failed with `KeyError: 'code'`
when a source had no neutral documents. The inputs are checked first, in `mixture_candidates`."""

from __future__ import annotations

import pytest

from moe_dag.mixture.search import MixtureSearchConfig, check_neutral_documents


def test_a_source_without_neutral_documents_is_refused_before_any_training():
    with pytest.raises(ValueError, match=r"'code' has 0 neutral documents.*evaluation\.neutral_share"):
        check_neutral_documents({"prose": 50, "intl": 40}, ["code", "intl", "prose"], minimum=20)


def test_a_source_with_too_few_is_named_with_its_count_and_the_minimum():
    with pytest.raises(ValueError, match=r"'intl' has 3 neutral documents, fewer than 20"):
        check_neutral_documents({"code": 50, "intl": 3}, ["code", "intl"], minimum=20)


def test_enough_neutral_documents_everywhere_passes():
    check_neutral_documents({"code": 20, "intl": 21}, ["code", "intl"], minimum=20)


def test_the_minimum_is_a_search_setting_of_at_least_one():
    assert MixtureSearchConfig().min_neutral_documents == 20
    with pytest.raises(ValueError, match="min_neutral_documents must be at least 1"):
        MixtureSearchConfig(min_neutral_documents=0)
