import sys

from moe_dag.assets.training import run_dir_for, training_command
from moe_dag.config import TrainingLaunchConfig


def test_one_process_runs_the_module_and_several_go_through_torchrun(tmp_path):
    single = training_command(TrainingLaunchConfig(steps=5), tmp_path / "data", tmp_path / "out")
    assert single[:3] == [sys.executable, "-m", "moe_dag.training"]
    assert single[single.index("--steps") + 1] == "5"

    launch = TrainingLaunchConfig(nproc_per_node=2, overrides={"optim.lr": 1e-3, "model.top_k": 1})
    several = training_command(launch, tmp_path / "data", tmp_path / "out")
    assert several[:4] == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert several[4:6] == ["-m", "moe_dag.training"]
    assert [several[i + 1] for i, arg in enumerate(several) if arg == "--set"] == [
        "model.top_k=1",
        "optim.lr=0.001",
    ]


def test_the_run_folder_follows_the_mixture_and_the_launch_config(tmp_path):
    (tmp_path / "mixture.json").write_text('{"num_sequences": 10}')
    launch = TrainingLaunchConfig()
    first = run_dir_for(tmp_path, launch, tmp_path / "runs")
    assert run_dir_for(tmp_path, launch, tmp_path / "runs") == first  # a rerun resumes in place
    assert run_dir_for(tmp_path, TrainingLaunchConfig(steps=301), tmp_path / "runs") != first
    (tmp_path / "mixture.json").write_text('{"num_sequences": 11}')
    assert run_dir_for(tmp_path, launch, tmp_path / "runs") != first
