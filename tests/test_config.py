from pathlib import Path

import pytest
import yaml

from moe_dag.config import load_config

MINIMAL = {
    "lake_root": "lake",
    "catalog_path": "catalog.duckdb",
    "sources": [{"name": "web", "kind": "web", "shards": "shards/web", "mixture_weight": 2.0}],
}


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_both_shipped_configs_load():
    demo = load_config("configs/demo.yaml")
    assert demo.source_names == ["code", "prose", "intl"]
    assert demo.demo_corpus is not None
    production = load_config("configs/production.yaml")
    assert production.oracle.backend == "openai"
    assert production.oracle.openai.model == "openai/gpt-oss-120b"
    assert (production.backbone.name_or_path, production.backbone.probe_layer) == ("openai/gpt-oss-20b", 18)
    assert production.mixture.total_tokens == 20_000_000_000


def test_mixture_weights_come_from_the_sources(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert config.mixture.weights == {"web": 2.0}
    with pytest.raises(ValueError, match="mixture.weights is taken from sources"):
        load_config(write(tmp_path, {**MINIMAL, "mixture": {"weights": {"web": 1.0}}}))


def test_a_misspelt_key_names_the_file_and_the_key_path(tmp_path):
    path = write(tmp_path, {**MINIMAL, "dedup": {"num_band": 14}})
    with pytest.raises(ValueError, match=r"pipeline\.yaml: unknown key\(s\) \['num_band'\] in dedup"):
        load_config(path)


def test_a_source_prefilter_override_must_name_a_real_field(tmp_path):
    source = {**MINIMAL["sources"][0], "prefilter": {"gopher_min_word": 3}}
    with pytest.raises(ValueError, match=r"sources\[web\]\.prefilter"):
        load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))
    source["prefilter"] = {"gopher_min_words": 3}
    config = load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))
    assert config.prefilter_for(config.source("web")).gopher_min_words == 3
    assert config.prefilter.gopher_min_words != 3


def test_bad_values_fail_at_load_time(tmp_path):
    with pytest.raises(ValueError, match="oracle.backend must be"):
        load_config(write(tmp_path, {**MINIMAL, "oracle": {"backend": "gpt"}}))
    with pytest.raises(ValueError, match="source names must be unique"):
        load_config(write(tmp_path, {**MINIMAL, "sources": MINIMAL["sources"] * 2}))
    with pytest.raises(FileNotFoundError, match="MOE_DAG_CONFIG"):
        load_config(tmp_path / "missing.yaml")


def test_nested_sections_are_built_and_checked(tmp_path):
    config = load_config(write(tmp_path, {**MINIMAL, "heads": {"judge": {"d_model": 64}}}))
    assert config.heads.judge.d_model == 64
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['width'\] in heads\.judge"):
        load_config(write(tmp_path, {**MINIMAL, "heads": {"judge": {"width": 64}}}))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['nme'\] in sources\[0\]"):
        load_config(write(tmp_path, {**MINIMAL, "sources": [{"nme": "web"}]}))


def test_a_source_kind_outside_the_fixed_set_fails_at_load(tmp_path):
    source = {**MINIMAL["sources"][0], "kind": "cdoe"}
    with pytest.raises(ValueError, match=r"sources\[0\].*kind must be one of .*'cdoe'"):
        load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))
