"""The tests' config helper applies changes as tests/pipeline_configs.py says."""

import pytest
import yaml

from moe_dag.config import load_config
from tests.pipeline_configs import Replace, with_changes

BASE = {
    "training": {"preset": "demo", "steps": 200, "overrides": {"parallel.ep": 2}},
    "sources": [{"name": "code", "keep_rate": 0.7}, {"name": "prose", "keep_rate": 0.7, "languages": ["en"]}],
}


def test_sections_merge_a_replace_takes_the_section_s_place_and_sources_go_by_name():
    changed = with_changes(BASE, {"training": {"steps": 8}, "sources": {"prose": {"keep_rate": 0.5}}})
    assert changed["training"] == {"preset": "demo", "steps": 8, "overrides": {"parallel.ep": 2}}
    assert changed["sources"] == [
        {"name": "code", "keep_rate": 0.7},
        {"name": "prose", "keep_rate": 0.5, "languages": ["en"]},
    ]
    assert with_changes(BASE, {"training": Replace(preset="tiny")})["training"] == {"preset": "tiny"}
    assert BASE["training"]["steps"] == 200  # the base is left as it was


def test_a_change_to_a_source_the_base_lacks_is_refused():
    with pytest.raises(KeyError, match="web"):
        with_changes(BASE, {"sources": {"web": {"keep_rate": 0.5}}})


def test_make_config_keeps_the_lake_and_catalog_in_the_test_s_folder(tmp_path, make_config):
    path = make_config({"training": Replace(preset="tiny", steps=3)})
    config = load_config(path)
    assert config.lake_root.startswith(str(tmp_path)) and str(config.catalog_path).startswith(str(tmp_path))
    assert yaml.safe_load(path.read_text())["training"] == {"preset": "tiny", "steps": 3}
