"""moe-dag's rule families against datatrove's filters on real documents installed on this machine.

Needs the `bench` extra (`make test` installs it); without it the tests skip and say so.
"""

from __future__ import annotations

import importlib.metadata

import pyarrow as pa
import pytest

from moe_dag.curation.filters import PrefilterConfig, run_filters
from moe_dag.curation.filters.language import LanguageFilter
from moe_dag.curation.filters.prefilter import FAMILIES

pytest.importorskip(
    "datatrove", reason="the datatrove comparison needs the 'bench' extra: pip install -e '.[bench]'"
)
pytest.importorskip(
    "spacy", reason="the datatrove comparison needs the 'bench' extra: pip install -e '.[bench]'"
)

from moe_dag.curation.filters.reference import (  # noqa: E402
    datatrove_filters,
    datatrove_keep,
    installed_documents,
)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    # Every fourth document keeps the test near 30 s; the benchmark compares them all.
    texts = installed_documents()[::4]
    assert len(texts) >= 200
    return texts


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_decides_as_datatrove(family, documents):
    ours, _ = run_filters(pa.table({"text": documents}), [PrefilterConfig.reference().family_filter(family)])
    theirs = [datatrove_keep(datatrove_filters()[family], text)[0] for text in documents]
    agreement = sum(a == b for a, b in zip(ours["keep"].to_pylist(), theirs, strict=True)) / len(documents)
    assert agreement >= 0.99, f"{family}: {agreement:.4f}"
    # Both keep and drop occur, so agreement is not trivially one-sided.
    assert 0 < sum(theirs) < len(theirs)


def test_language_id_still_loads_beside_the_bench_extra():
    """datatrove[processing] would put fasttext-numpy2-wheel over the `fasttext` module lid.176 loads with."""
    installed = {dist.metadata["Name"].lower() for dist in importlib.metadata.distributions()}
    assert "fasttext-numpy2-wheel" not in installed
    assert "fasttext-predict" in installed
    scores = LanguageFilter(languages=[]).score(
        ["The committee will publish its final report on the water supply next spring."]
    )
    assert scores["language"][0] == "en" and scores["language_score"][0] > 0.8


def test_spacy_tables_match_the_installed_spacy(tmp_path):
    """`spacy_english.py` is generated: regenerated from the installed spaCy it holds the same tables."""
    import importlib.util

    from moe_dag.curation.filters import spacy_english
    from moe_dag.curation.filters.reference import write_spacy_english

    path = tmp_path / "regenerated.py"
    write_spacy_english(path)
    spec = importlib.util.spec_from_file_location("regenerated", path)
    regenerated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerated)
    for name in ("PREFIX", "SUFFIX", "INFIX", "URL", "SENTENCE_PUNCTUATION", "SPECIAL_CASES"):
        assert getattr(regenerated, name) == getattr(spacy_english, name), name
