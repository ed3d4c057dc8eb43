import os
import sys

from moe_dag.assets.training_runs import RUN_CONFIG_FILE, run_dir_for, training_command
from moe_dag.config import TrainingLaunchConfig
from moe_dag.training.__main__ import _launch_workers, _without_option


def test_the_command_runs_the_module_which_starts_torchrun_workers_itself(tmp_path):
    single = training_command(TrainingLaunchConfig(steps=5), tmp_path / "data", tmp_path / "out")
    assert single[:3] == [sys.executable, "-m", "moe_dag.orchestration.pipes_training"]
    assert single[single.index("--config") + 1] == str(tmp_path / "out" / RUN_CONFIG_FILE)
    assert single[single.index("--nproc-per-node") + 1] == "1" and "--eval-on" not in single

    launch = TrainingLaunchConfig(nproc_per_node=2, overrides={"optim.lr": 1e-3, "model.top_k": 1})
    several = training_command(launch, tmp_path / "data", tmp_path / "out", eval_on=tmp_path / "heldout")
    assert several[several.index("--nproc-per-node") + 1] == "2"
    assert several[several.index("--eval-on") + 1] == str(tmp_path / "heldout")
    # The workers torchrun starts get the same arguments, less the option that started them.
    worker = _without_option(several[3:], "--nproc-per-node")
    assert "--nproc-per-node" not in worker and len(worker) == len(several) - 5
    assert _without_option(["--nproc-per-node=4", "--out", "x"], "--nproc-per-node") == ["--out", "x"]


def test_the_run_folder_follows_the_mixture_and_the_launch_config(tmp_path):
    (tmp_path / "mixture.json").write_text('{"num_sequences": 10}')
    launch = TrainingLaunchConfig()
    first = run_dir_for(tmp_path, launch, tmp_path / "runs")
    assert run_dir_for(tmp_path, launch, tmp_path / "runs") == first  # a rerun resumes in place
    assert run_dir_for(tmp_path, TrainingLaunchConfig(steps=301), tmp_path / "runs") != first
    (tmp_path / "mixture.json").write_text('{"num_sequences": 11}')
    assert run_dir_for(tmp_path, launch, tmp_path / "runs") != first


def test_torchruns_workers_run_the_module_that_launched_them(monkeypatch):
    from torch.distributed import run as torchrun

    started = []
    monkeypatch.setattr(torchrun, "main", started.append)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the lifeline variables stay in this test
    _launch_workers(2, ["--nproc-per-node", "2", "--out", "x"], "moe_dag.orchestration.pipes_training")
    assert started == [
        ["--standalone", "--nproc-per-node=2", "-m", "moe_dag.orchestration.pipes_training", "--out", "x"]
    ]
