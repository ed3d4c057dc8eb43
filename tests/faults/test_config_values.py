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
    with pytest.raises(
        ValueError, match=r"pipeline\.yaml: invalid sources\[0\]: name .* is not a safe identifier"
    ):
        load_with(tmp_path, {"name": name})


def test_a_safe_name_loads(tmp_path):
    assert load_with(tmp_path, {"name": "cc-2024_10"}).source_names == ["cc-2024_10"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"languages": "en"}, r"sources\[0\]\.languages must be list\[str\], got str 'en'"),
        ({"keep_rate": "high"}, r"sources\[0\]\.keep_rate must be float, got str 'high'"),
        ({"keep_rate": 1.5}, r"sources\[0\]\.keep_rate must lie between 0 and 1, got 1\.5"),
        ({"keep_rate": 0}, r"keep_rate must be in \(0, 1\]"),
        ({"mixture_weight": -1}, r"sources\[0\]\.mixture_weight must be a finite number >= 0, got -1"),
        ({"mixture_weight": 0}, r"at least one source needs a mixture_weight above 0"),
        ({"kind": "cdoe"}, r"kind must be one of \[.*\], got 'cdoe'"),
        (
            {"prefilter": {"gopher_min_words": "fifty"}},
            r"sources\[web\]\.prefilter\.gopher_min_words must be int",
        ),
        ({"prefilter": {"min_word": 3}}, r"unknown key\(s\) \['min_word'\] in sources\[web\]\.prefilter"),
    ],
)
def test_source_values_are_type_and_range_checked(tmp_path, source, message):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: .*" + message):
        load_with(tmp_path, source)


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ({"dedup": {"num_bands": 14.5}}, r"dedup\.num_bands must be int, got float 14\.5"),
        ({"dedup": {"num_bands": True}}, r"dedup\.num_bands must be int, got bool"),
        ({"mixture": {"heldout_fraction": 2}}, r"mixture\.heldout_fraction must lie between 0 and 1"),
        ({"oracle": {"per_source": float("nan")}}, r"oracle\.per_source must be int"),
        ({"oracle": {"backend": "gpt"}}, r"oracle\.backend must be one of \['rules', 'openai', 'vllm'\]"),
        ({"training": {"overrides": {"model.top_kk": 2}}}, r"training.*has no field 'top_kk'"),
        ({"training": {"overrides": {"optim.lr": "fast"}}}, r"training.*optim\.lr=fast.*expected float"),
        ({"training": {"steps": 0}}, r"steps and nproc_per_node must be at least 1"),
    ],
)
def test_stage_values_are_checked_at_load(tmp_path, top, message):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: .*" + message):
        load_with(tmp_path, **top)
