"""Issue 35, item 10: every count, size and weight has a declared range, refused when the config loads
with the file, the key and the range, and a refusal says what was wrong with the value."""

from pathlib import Path

import pytest
import yaml

from moe_dag.config import PipelineConfig, load_config
from moe_dag.training.config import Config
from moe_dag.training.strict_config import declared_ranges

SOURCES = [
    {"name": "web", "kind": "web", "shards": "shards/web"},
    {"name": "code", "kind": "code", "shards": "c"},
]


def load_with(tmp_path: Path, sources: list[dict] = SOURCES, **top) -> PipelineConfig:
    raw = {"lake_root": "lake", "catalog_path": "c.duckdb", "sources": sources, **top}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


@pytest.mark.parametrize(
    ("top", "message"),
    [
        (
            {"dedup": {"num_bands": 1_000_000_000}},
            r"dedup\.num_bands: must be in \[1, 1024\], got 1000000000",
        ),
        ({"dedup": {"rows_per_band": 5000}}, r"dedup\.rows_per_band: must be in \[1, 1024\], got 5000"),
        ({"dedup": {"num_bands": 512, "rows_per_band": 512}}, r"dedup: .*num_bands x rows_per_band"),
        (
            {"training": {"nproc_per_node": 100_000}},
            r"training\.nproc_per_node: must be in \[1, 128\], got 100000",
        ),
        ({"training": {"nnodes": 10**6}}, r"training\.nnodes: must be in \[1, 4096\], got 1000000"),
        ({"training": {"steps": 10**12}}, r"training\.steps: must be in \[1, 10000000\], got 1000000000000"),
        ({"training": {"steps": 0}}, r"training\.steps: must be in \[1, 10000000\], got 0"),
        ({"tokenizer": {"vocab_size": 10**9}}, r"tokenizer\.vocab_size: must be in \[259, 1048576\], got"),
        (
            {"training": {"overrides": {"model.vocab_size": 10**9}}},
            r"training\.overrides\.model\.vocab_size: must be in \[1, 1048576\], got 1000000000",
        ),
        ({"oracle": {"per_source": 10**9}}, r"oracle\.per_source: must be in \[1, 1000000\], got 1000000000"),
        ({"oracle": {"per_source": 0}}, r"oracle\.per_source: must be in \[1, 1000000\], got 0"),
        (
            {"mixture_search": {"candidates": 10**9}},
            r"mixture_search\.candidates: must be in \[4, 4096\], got 1000000000",
        ),
        ({"mixture_search": {"steps": 10**9}}, r"mixture_search\.steps: must be in \[1, 10000000\], got"),
        ({"lake_root": ""}, r"lake_root: must not be empty"),
        ({"catalog_path": "  "}, r"catalog_path: must not be empty"),
        (
            {"demo_corpus": {"docs_per_source": 0}},
            r"demo_corpus: docs_per_source must be at least \d+ .*got 0",
        ),
        ({"mixture": {"total_tokens": -1}}, r"mixture\.total_tokens: must be a finite number >= 0, got -1"),
    ],
)
def test_values_out_of_range_are_refused_at_load(tmp_path, top, message):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: " + message):
        load_with(tmp_path, **top)


def test_a_zero_mixture_weight_is_refused_at_load(tmp_path):
    """Weight 0 loaded (another source had a weight) and failed later, at tokenized_mixture."""
    sources = [SOURCES[0], {**SOURCES[1], "mixture_weight": 0}]
    with pytest.raises(ValueError, match=r"pipeline\.yaml: sources\[1\]\.mixture_weight: must be > 0, got 0"):
        load_with(tmp_path, sources)


def test_an_empty_shards_path_is_refused(tmp_path):
    sources = [SOURCES[0], {**SOURCES[1], "shards": ""}]
    with pytest.raises(ValueError, match=r"pipeline\.yaml: sources\[1\]\.shards: must not be empty"):
        load_with(tmp_path, sources)


def test_the_bounds_hold_at_their_ends(tmp_path):
    config = load_with(
        tmp_path,
        dedup={"num_bands": 128, "rows_per_band": 32},
        training={"nproc_per_node": 128, "steps": 10_000_000},
        mixture_search={"candidates": 4096},
    )
    assert config.dedup.num_hashes == 4096 and config.training.nproc_per_node == 128


def test_every_declared_range_is_documented():
    """docs/configuration.md lists each key with a declared range (the pipeline config's and the training
    config's, set in presets or `training.overrides`), with that range."""
    docs = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    ranges = {**declared_ranges(PipelineConfig), **declared_ranges(Config)}
    assert {"dedup.num_bands", "training.nproc_per_node", "sources[].mixture_weight"} <= set(ranges)
    rows = [f"| `{key}` | {bound} |" for key, bound in ranges.items()]
    missing = [row for row in rows if row not in docs]
    assert not missing, "rows missing from docs/configuration.md:\n" + "\n".join(missing)
