"""Issue 18: the training preset is resolved once, in the Dagster process, and everything it says is in
moe_proxy's code version and its run folder; the trainer receives the resolved config, not a name."""

from __future__ import annotations

import json
from pathlib import Path

from moe_dag.assets.operating import operation
from moe_dag.assets.training_runs import RUN_CONFIG_FILE, run_dir_for, training_command, write_run_config
from moe_dag.config import load_config
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.settings.stage import builds_per_source
from moe_dag.training.__main__ import parse_args, resolve_config
from moe_dag.training.baselines import dense_overrides
from moe_dag.training.config import PRESET_DIR, Config
from tests.pipeline_configs import Replace, demo_config

TRAINING_ASSETS = {"moe_proxy", "curation_gain", "moe_gain"}


def pipeline_with_preset(tmp_path: Path, preset_text: str) -> Path:
    """configs/demo.yaml training with a copy of the demo preset that the test may edit."""
    preset = tmp_path / "models" / "demo.yaml"
    preset.parent.mkdir(exist_ok=True)
    preset.write_text(preset_text)
    return demo_config(tmp_path, {"training": {"preset": str(preset)}})


def code_versions(path: Path) -> dict[str, str]:
    graph = build_definitions(path).resolve_asset_graph()
    return {key.to_user_string(): graph.get(key).code_version for key in graph.get_all_asset_keys()}


def reading_training(path: Path) -> set[str]:
    """The assets whose settings object holds the `training` section."""
    definitions = build_definitions(path)
    config = definitions.resources["pipeline"].config
    return {
        spec.key.to_user_string()
        for asset in definitions.assets
        for spec in asset.specs
        if not builds_per_source(operation(spec).settings)
        and hasattr(operation(spec).settings(config), "training")
    }


def test_editing_any_training_setting_of_the_preset_makes_moe_proxy_stale_in_a_new_run_folder(tmp_path):
    original = (PRESET_DIR / "demo.yaml").read_text()
    path = pipeline_with_preset(tmp_path, original)
    (tmp_path / "mixture.json").write_text('{"num_sequences": 10}')
    before, before_dir = code_versions(path), run_dir_for(tmp_path, load_config(path).training, tmp_path)
    # An optimizer setting only: the trainer used to resume such a run silently with the old settings.
    path = pipeline_with_preset(tmp_path, original.replace("warmup_steps: 30", "warmup_steps: 31"))
    after, after_dir = code_versions(path), run_dir_for(tmp_path, load_config(path).training, tmp_path)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == reading_training(path) and changed >= TRAINING_ASSETS
    assert after_dir != before_dir
    # The same content in the same file: the same version and the same folder, so a rerun resumes.
    assert code_versions(path) == after
    assert run_dir_for(tmp_path, load_config(path).training, tmp_path) == after_dir


def test_the_trainer_receives_the_resolved_config_not_the_preset_name(tmp_path, make_config):
    training = Replace(preset="tiny", steps=9, seed=4, overrides={"optim.lr": 2.0e-3})
    launch = load_config(make_config({"training": training})).training
    out = tmp_path / "run"
    write_run_config(launch, out)
    command = training_command(launch, tmp_path / "data", out)
    assert "--preset" not in command and "--set" not in command and "--steps" not in command
    assert command[command.index("--config") + 1] == str(out / RUN_CONFIG_FILE)
    assert Config.from_dict(json.loads((out / RUN_CONFIG_FILE).read_text())) == launch.resolved
    # The trainer's command line reads that file as it is: nothing is resolved a second time.
    trainer_config = resolve_config(parse_args(command[3:]))
    assert trainer_config == launch.resolved
    assert (trainer_config.train.steps, trainer_config.train.seed, trainer_config.optim.lr) == (9, 4, 2e-3)


def test_the_dense_twin_changes_the_resolved_config_without_reading_the_preset_again(tmp_path):
    path = pipeline_with_preset(tmp_path, (PRESET_DIR / "demo.yaml").read_text())
    launch = load_config(path).training
    (tmp_path / "models" / "demo.yaml").write_text("model: {d_model: 64}\n")  # read again, it would show
    dense = launch.with_overrides(dense_overrides(launch.resolved.model))
    assert dense.resolved.model.first_dense_layers == launch.resolved.model.n_layers
    assert dense.resolved.model.d_model == launch.resolved.model.d_model == 128
    assert dense.resolved.optim == launch.resolved.optim and dense.resolved.train == launch.resolved.train
    (tmp_path / "mixture.json").write_text("{}")
    assert run_dir_for(tmp_path, dense, tmp_path) != run_dir_for(tmp_path, launch, tmp_path)
