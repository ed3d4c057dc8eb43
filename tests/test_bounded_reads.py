"""No asset reads a whole source into the Dagster process (issue 19): what needs every row of a slice
(the oracle's sample, the prefilter's fit sample, counts, checksums) runs in Ray tasks that return small
results, and these tests hold those distributed forms equal to the in-memory references."""

from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pytest
from test_end_to_end import tiny_config

from moe_dag.config import PipelineConfig, load_config
from moe_dag.data.demo_corpus import build_demo_corpus
from moe_dag.data.filters import build_prefilters
from moe_dag.data.fits import fit_source, fit_source_in_tasks
from moe_dag.data.ingest import ingest_source
from moe_dag.data.lake import Lake
from moe_dag.data.oracle import sample_slice, split_sample

SCHEMA = pa.schema({"id": pa.string(), "text": pa.string(), "source": pa.string(), "keep": pa.bool_()})


def _slice(lake: Lake, stage: str, source: str, files: int, seed: int = 0) -> pa.Table:
    """Files of random sizes (one empty) whose lengths repeat, so ties cross bucket edges; returns the
    kept rows as one table, without `keep`."""
    rng = random.Random(seed)
    tables = []
    for f in range(files):
        n = 0 if f == 1 else rng.randint(1, 300)
        table = pa.table(
            {
                "id": [f"{source}/{f}-{i}" for i in range(n)],
                "text": ["x" * rng.choice([5, 10, 10, 40, rng.randint(1, 500)]) for _ in range(n)],
                "source": [source] * n,
                "keep": [rng.random() < 0.8 for _ in range(n)],
            },
            schema=SCHEMA,
        )
        lake.write_file(table, lake.shard_path(stage, source, f"shard-{f}"))
        tables.append(table)
    whole = pa.concat_tables(tables)
    return whole.filter(whole["keep"]).drop_columns(["keep"])


@pytest.mark.parametrize(("labelled", "calibration"), [(8, 20), (50, 200), (10, 0), (2000, 5), (30, 10_000)])
def test_the_sample_drawn_per_file_is_the_in_memory_sample(tmp_path, labelled, calibration):
    lake = Lake(tmp_path)
    kept = _slice(lake, "toxicity_filtered", "web", files=5)
    expected = split_sample(kept, labelled, calibration, seed=3)
    drawn = sample_slice(lake, "toxicity_filtered", "web", ["id", "text", "source"], labelled, calibration, 3)
    assert drawn[0].equals(expected[0]) and drawn[1].equals(expected[1])
    assert not set(drawn[0]["id"].to_pylist()) & set(drawn[1]["id"].to_pylist())


def test_the_sample_does_not_depend_on_how_rows_are_split_into_files(tmp_path):
    lake = Lake(tmp_path / "many")
    kept = _slice(lake, "toxicity_filtered", "web", files=6)
    one = Lake(tmp_path / "one")
    one.write_file(
        kept.append_column("keep", pa.array([True] * kept.num_rows)), one.shard_path("t", "web", "all")
    )
    columns = ["id", "text", "source"]
    many_files = sample_slice(lake, "toxicity_filtered", "web", columns, 40, 100, 1)
    one_file = sample_slice(one, "t", "web", columns, 40, 100, 1)
    for a, b in zip(many_files, one_file, strict=True):
        assert sorted(a["id"].to_pylist()) == sorted(b["id"].to_pylist())


@pytest.fixture(scope="module")
def demo_lake(tmp_path_factory) -> tuple[Lake, PipelineConfig]:
    """raw_documents of the tiny demo corpus (three sources, shards of 25 documents), ingested here."""
    tmp_path = tmp_path_factory.mktemp("demo")
    config = load_config(tiny_config(tmp_path))
    build_demo_corpus(tmp_path / "corpus", config.demo_corpus)
    lake = Lake(config.lake_root)
    for source in config.sources:
        ingest_source(lake, source.name, source.shards, workers=0)
    return lake, config


@pytest.mark.parametrize(
    ("source_name", "max_documents"), [("intl", 45), ("intl", 100_000), ("prose", 100_000)]
)
def test_the_fit_made_in_tasks_is_the_fit_made_here(demo_lake, source_name, max_documents):
    """Same model, cuts and version, whether the fit sample ends inside a shard or takes the source."""
    lake, config = demo_lake
    source = config.source(source_name)
    settings = dataclasses.replace(
        config.prefilter_for(source),
        perplexity=dataclasses.replace(config.prefilter_for(source).perplexity, min_documents=10),
    )

    def filters() -> list:
        return build_prefilters(settings, source.kind, source.languages)

    here = fit_source(filters(), lake.iter_batches("raw_documents", source.name), max_documents, "s")
    in_tasks = fit_source_in_tasks(filters(), lake, "raw_documents", source.name, max_documents, "s")
    assert in_tasks.documents == here.documents == min(max_documents, 60)
    assert in_tasks.describe() == here.describe()
    assert in_tasks.filters["perplexity"].model is not None
    assert in_tasks.version == here.version
