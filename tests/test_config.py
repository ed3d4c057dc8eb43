from pathlib import Path

import pytest
import yaml

from moe_dag.config import load_config
from moe_dag.training.config import apply_overrides, preset, tiny

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
    with pytest.raises(ValueError, match=r"mixture\.weights: taken from sources\[\]\.mixture_weight"):
        load_config(write(tmp_path, {**MINIMAL, "mixture": {"weights": {"web": 1.0}}}))


def test_the_removed_exit_bound_settings_say_what_replaced_them(tmp_path):
    for calibration in ({"exit_bound": "exits"}, {"exit_bound": "decisions"}):
        with pytest.raises(
            ValueError, match=r"pipeline\.yaml: calibration\.exit_bound: removed: .*max_decisions_changed"
        ):
            load_config(write(tmp_path, {**MINIMAL, "calibration": calibration}))
    with pytest.raises(
        ValueError, match=r"calibration\.max_exit_error: removed .*use calibration\.max_decisions_changed"
    ):
        load_config(write(tmp_path, {**MINIMAL, "calibration": {"max_exit_error": 0.01}}))
    config = load_config(write(tmp_path, {**MINIMAL, "calibration": {"max_decisions_changed": 0.02}}))
    assert config.calibration.max_decisions_changed == 0.02


def test_a_misspelt_key_names_the_file_and_the_key_path(tmp_path):
    path = write(tmp_path, {**MINIMAL, "dedup": {"num_band": 14}})
    with pytest.raises(
        ValueError, match=r"pipeline\.yaml: dedup\.num_band: unknown key; did you mean 'num_bands'\?"
    ):
        load_config(path)


def test_a_source_prefilter_override_must_name_a_real_field(tmp_path):
    source = {**MINIMAL["sources"][0], "prefilter": {"gopher_quality": {"min_word": 3}}}
    with pytest.raises(
        ValueError, match=r"sources\[0\]\.prefilter\.gopher_quality\.min_word: unknown key; did you mean"
    ):
        load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))
    source["prefilter"] = {"gopher_quality": {"min_words": 3}}
    config = load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))
    assert config.prefilter_for(config.source("web")).gopher_quality.min_words == 3
    assert config.prefilter.gopher_quality.min_words != 3


def test_bad_values_fail_at_load_time(tmp_path):
    with pytest.raises(ValueError, match=r"oracle\.backend: expected one of"):
        load_config(write(tmp_path, {**MINIMAL, "oracle": {"backend": "gpt"}}))
    with pytest.raises(ValueError, match="source names must be unique"):
        load_config(write(tmp_path, {**MINIMAL, "sources": MINIMAL["sources"] * 2}))
    with pytest.raises(FileNotFoundError, match="MOE_DAG_CONFIG"):
        load_config(tmp_path / "missing.yaml")


def test_nested_sections_are_built_and_checked(tmp_path):
    config = load_config(write(tmp_path, {**MINIMAL, "heads": {"judge": {"d_model": 64}}}))
    assert config.heads.judge.d_model == 64
    with pytest.raises(ValueError, match=r"heads\.judge\.width: unknown key"):
        load_config(write(tmp_path, {**MINIMAL, "heads": {"judge": {"width": 64}}}))
    with pytest.raises(ValueError, match=r"sources\[0\]\.nme: unknown key"):
        load_config(write(tmp_path, {**MINIMAL, "sources": [{"nme": "web"}]}))


def test_a_source_kind_outside_the_fixed_set_fails_at_load(tmp_path):
    source = {**MINIMAL["sources"][0], "kind": "cdoe"}
    with pytest.raises(ValueError, match=r"sources\[0\]\.kind: expected one of .*, got 'cdoe'"):
        load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))


# Issue 18: one strict loader for the pipeline config, the model presets and the overrides.


def write_preset(tmp_path: Path, text: str, name: str = "preset.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_unknown_key_in_a_preset_names_the_file_and_the_key_path(tmp_path):
    bad = write_preset(tmp_path, "base: demo\nmodel:\n  mla:\n    kv_lora_rnk: 16\n")
    with pytest.raises(ValueError, match=r"preset\.yaml: model\.mla\.kv_lora_rnk: unknown key"):
        preset(str(bad))
    # The same message when the pipeline config names the preset: the preset is checked at load.
    with pytest.raises(ValueError, match=r"preset\.yaml: model\.mla\.kv_lora_rnk: unknown key"):
        load_config(write(tmp_path, {**MINIMAL, "training": {"preset": str(bad)}}))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model:\n  d_model: wide\n", r"model\.d_model: expected int, got str 'wide'"),
        ("model:\n  attention_pattern: gqa\n", r"model\.attention_pattern: expected tuple\[.*got str 'gqa'"),
        ("optim:\n  lr: fast\n", r"optim\.lr: expected float, got str 'fast'"),
        ("train:\n  steps: 1.5\n", r"train\.steps: expected int, got float 1\.5"),
        ("precision:\n  recipe: fp7\n", r"precision\.recipe: expected one of \[.*'fp8'.*\], got 'fp7'"),
    ],
)
def test_preset_values_are_typed(tmp_path, text, message):
    with pytest.raises(ValueError, match=r"preset\.yaml: " + message):
        preset(str(write_preset(tmp_path, text)))


def test_a_preset_name_that_does_not_exist_fails_at_load(tmp_path):
    with pytest.raises(ValueError, match=r"pipeline\.yaml: training\.preset: unknown preset 'demo2'"):
        load_config(write(tmp_path, {**MINIMAL, "training": {"preset": "demo2"}}))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.top_k=two", r"--set: model\.top_k: expected int, got str 'two'"),
        ("train.wandb_mode=1", r"--set: train\.wandb_mode: expected one of .* \| null, got int 1"),
        ("optim.grad_clip=[1]", r"optim\.grad_clip: expected float \| null, got list \[1\]"),
        ("model.topk=1", r"--set: model\.topk: unknown key; did you mean 'top_k'\?"),
        ("model.mla=3", r"model\.mla: expected a mapping, got int 3"),
        ("lr=1e-3", r"--set: lr: unknown key"),
        ("model.top_k", r"--set model\.top_k: must look like section\.field=value"),
    ],
)
def test_a_bad_override_is_refused_with_its_key(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(tiny(), [override])


def test_override_values_are_yaml_parsed_once():
    config = apply_overrides(
        tiny(), ["optim.lr=1e-3", "optim.grad_clip=null", "model.attention_pattern=kda,mla", "model.top_k=1"]
    )
    assert config.optim.lr == 1e-3 and config.optim.grad_clip is None and config.model.top_k == 1
    assert config.model.attention_pattern == ("kda", "mla")


def test_pipeline_overrides_keep_their_yaml_types(tmp_path):
    """A string in the YAML stays a string: no round trip through `key=value` text makes it a number."""
    ok = load_config(write(tmp_path, {**MINIMAL, "training": {"overrides": {"train.batch_size": 8}}}))
    assert ok.training.resolved.train.batch_size == 8
    for value, shown in (("8", "str '8'"), ([8], r"list \[8\]")):
        training = {"overrides": {"train.batch_size": value}}
        with pytest.raises(
            ValueError,
            match=r"pipeline\.yaml: training\.overrides\.train\.batch_size: expected int, got " + shown,
        ):
            load_config(write(tmp_path, {**MINIMAL, "training": training}))


def test_a_code_source_with_languages_is_refused_at_load(tmp_path):
    source = {"name": "code", "kind": "code", "shards": "shards/code", "languages": ["en"]}
    with pytest.raises(ValueError, match=r"pipeline\.yaml: sources\[0\]\.languages: .*kind 'code'"):
        load_config(write(tmp_path, {**MINIMAL, "sources": [source]}))
    source["languages"] = None
    assert load_config(write(tmp_path, {**MINIMAL, "sources": [source]})).source("code").languages is None


def test_the_training_config_is_resolved_once_at_load(tmp_path):
    training = {"preset": "tiny", "steps": 7, "seed": 3, "overrides": {"optim.lr": 1.0e-4}}
    config = load_config(write(tmp_path, {**MINIMAL, "training": training}))
    resolved = config.training.resolved
    assert (resolved.train.steps, resolved.train.seed, resolved.optim.lr) == (7, 3, 1e-4)
    assert resolved.model == preset("tiny").model


def test_the_command_line_says_a_config_error_in_one_line(tmp_path, capsys):
    from moe_dag.cli import main as cli

    path = tmp_path / "pipeline.yaml"
    path.write_text("lake_root: lake\nsources: []\nlake_rot: typo\n")
    assert cli.main(["--config", str(path), "summary"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("moe-dag: ") and "lake_rot" in error and "Traceback" not in error
