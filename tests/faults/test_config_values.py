"""Issue 6, items 7 and 8: hostile or mistaken config values fail when the config loads, naming the
file and the key, instead of escaping the lake or failing deep inside a stage."""

from pathlib import Path

import pytest
import yaml

from moe_dag.config import PipelineConfig, load_config

SOURCE = {"name": "web", "kind": "web", "shards": "shards/web"}


def load_with(tmp_path: Path, source: dict | None = None, **top) -> PipelineConfig:
    raw = {"lake_root": "lake", "catalog_path": "c.duckdb", "sources": [{**SOURCE, **(source or {})}], **top}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


@pytest.mark.parametrize("name", ["../../../../../pwned", "a/b", "", ".hidden", "x" * 65, "with space"])
def test_unsafe_source_names_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: sources\[0\]\.name: .* is not a safe identifier"):
        load_with(tmp_path, {"name": name})


def test_a_safe_name_loads(tmp_path):
    assert load_with(tmp_path, {"name": "cc-2024_10"}).source_names == ["cc-2024_10"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"languages": "en"}, r"sources\[0\]\.languages: expected list\[str\] \| null, got str 'en'"),
        ({"keep_rate": "high"}, r"sources\[0\]\.keep_rate: expected float, got str 'high'"),
        ({"keep_rate": 1.5}, r"sources\[0\]\.keep_rate: must lie between 0 and 1, got 1\.5"),
        ({"keep_rate": 0}, r"sources\[0\]\.keep_rate: must be in \(0, 1\]"),
        ({"mixture_weight": -1}, r"sources\[0\]\.mixture_weight: must be a finite number >= 0, got -1"),
        ({"mixture_weight": 0}, r"sources\[0\]\.mixture_weight: must be > 0, got 0"),
        ({"kind": "cdoe"}, r"sources\[0\]\.kind: expected one of \[.*\], got 'cdoe'"),
        (
            {"prefilter": {"gopher_quality": {"min_words": "fifty"}}},
            r"sources\[0\]\.prefilter\.gopher_quality\.min_words: expected int, got str 'fifty'",
        ),
        ({"prefilter": {"min_word": 3}}, r"sources\[0\]\.prefilter\.min_word: unknown key"),
    ],
)
def test_source_values_are_type_and_range_checked(tmp_path, source, message):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: .*" + message):
        load_with(tmp_path, source)


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"dedup": {"num_bands": 14.5}}, r"dedup\.num_bands: expected int, got float 14\.5"),
        ({"dedup": {"num_bands": True}}, r"dedup\.num_bands: expected int, got bool"),
        ({"mixture": {"heldout_fraction": 2}}, r"mixture\.heldout_fraction: must lie between 0 and 1"),
        ({"oracle": {"per_source": float("nan")}}, r"oracle\.per_source: expected int"),
        ({"oracle": {"backend": "gpt"}}, r"oracle\.backend: expected one of \['rules', 'openai', 'vllm'\]"),
        (
            {"training": {"overrides": {"model.top_kk": 2}}},
            r"training\.overrides\.model\.top_kk: unknown key",
        ),
        (
            {"training": {"overrides": {"optim.lr": "fast"}}},
            r"training\.overrides\.optim\.lr: expected float",
        ),
        ({"training": {"steps": 0}}, r"training\.steps: must be in \[1, 10000000\], got 0"),
    ],
)
def test_stage_values_are_checked_at_load(tmp_path, top, message):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: .*" + message):
        load_with(tmp_path, **top)


# Issue 23, item 13: late and loose config.


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"mixture": {"seq_len": 0}}, r"mixture: .*seq_len"),
        ({"mixture": {"total_tokens": 0}}, r"mixture: .*total_tokens"),
        ({"tokenizer": {"vocab_size": 0}}, r"tokenizer\.vocab_size: must be in \[259, 1048576\], got 0"),
        ({"oracle": {"per_source": 0}}, r"oracle\.per_source: must be in \[1, 1000000\], got 0"),
        (
            {"training": {"overrides": {"model.vocab_size": 0}}},
            r"training\.overrides\.model\.vocab_size: must be",
        ),
        ({"training": {"overrides": {"model.seq_len": 0}}}, r"training\.overrides\.model\.seq_len: must be"),
    ],
)
def test_zero_sizes_are_refused_at_load(tmp_path, top, message):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: .*" + message):
        load_with(tmp_path, **top)


def test_a_duplicate_key_is_refused_with_its_file_and_line(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        "lake_root: lake\ncatalog_path: c.duckdb\n"
        "sources:\n  - {name: web, kind: web, shards: shards/web}\n"
        "mixture:\n  seq_len: 128\n  seq_len: 64\n"
    )
    with pytest.raises(ValueError, match=r"pipeline\.yaml:7: duplicate key 'seq_len' \(first at line 6\)"):
        load_config(path)


def test_a_duplicate_key_in_a_preset_is_refused(tmp_path):
    from moe_dag.training.config import preset

    path = tmp_path / "preset.yaml"
    path.write_text("optim:\n  lr: 1.0e-3\noptim:\n  warmup_steps: 3\n")
    with pytest.raises(ValueError, match=r"preset\.yaml:3: duplicate key 'optim' \(first at line 1\)"):
        preset(str(path))


def test_a_lake_root_with_glob_characters_reads_its_own_rows(tmp_path):
    """`[1]` in a path is a character class to a glob: unescaped, every lake glob matched nothing."""
    import pyarrow as pa

    from moe_dag.storage.catalog import Catalog
    from moe_dag.storage.lake import Lake

    lake = Lake(tmp_path / "run[1]*?" / "lake")
    for source in ("web", "code"):
        table = pa.table(
            {"id": [f"{source}-{i}" for i in range(3)], "source": [source] * 3, "keep": [True] * 3}
        )
        lake.write_file(table, lake.shard_path("prefiltered", source, "s0"))
        lake.write_record("prefiltered", source, "s0", {"rows": 3})
    assert [path.rsplit("/", 1)[-1] for path in lake.parquet_files("prefiltered", "web")] == ["s0.parquet"]
    assert lake.read_table("prefiltered", "code").num_rows == 3
    assert set(lake.records("prefiltered", "web")) == {"s0"}
    assert lake.stored_keys("prefiltered", "web") == {"s0"}
    catalog = Catalog(tmp_path / "catalog.duckdb", lake)
    assert "prefiltered" in catalog.refresh({"prefiltered": True})
    assert catalog.query("SELECT source, count(*) FROM prefiltered GROUP BY source ORDER BY source") == [
        ("code", 3),
        ("web", 3),
    ]
