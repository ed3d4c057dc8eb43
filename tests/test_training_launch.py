import os
import sys

import pytest

from moe_dag.assets.training_runs import RUN_CONFIG_FILE, run_dir_for, training_command
from moe_dag.config import TrainingLaunchConfig
from moe_dag.training.__main__ import _launch_workers, _rendezvous, parse_args
from moe_dag.training.multinode import Rendezvous, without_options
from moe_dag.training.strict_config import ConfigError


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
    worker = without_options(several[3:], ("--nproc-per-node",))
    assert "--nproc-per-node" not in worker and len(worker) == len(several) - 5
    assert without_options(["--nproc-per-node=4", "--out", "x"], ("--nproc-per-node",)) == ["--out", "x"]


def test_the_run_folder_follows_the_mixture_and_the_launch_config(tmp_path):
    (tmp_path / "mixture.json").write_text('{"num_sequences": 10}')
    launch = TrainingLaunchConfig()
    first = run_dir_for(tmp_path, launch, tmp_path / "runs")
    assert run_dir_for(tmp_path, launch, tmp_path / "runs") == first  # a rerun resumes in place
    assert run_dir_for(tmp_path, TrainingLaunchConfig(steps=301), tmp_path / "runs") != first
    tracked = TrainingLaunchConfig(
        overrides={"train.tracking": "mlflow", "train.tracking_uri": "http://h:5000"}
    )
    assert run_dir_for(tmp_path, tracked, tmp_path / "runs") == first  # where it is tracked: same run
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


def test_several_nodes_add_the_rendezvous_and_one_agent_per_node_fixes_its_own(tmp_path):
    launch = TrainingLaunchConfig(nproc_per_node=2, nnodes=3, rdzv_endpoint="head:29400")
    command = training_command(launch, tmp_path / "data", tmp_path / "out", rendezvous_id="run-1")
    assert command[command.index("--nnodes") + 1] == "3"
    assert command[command.index("--rdzv-endpoint") + 1] == "head:29400"
    assert command[command.index("--rdzv-id") + 1] == "run-1" and "--ray-address" not in command
    # One node: the command, and so the run folder, of before.
    (tmp_path / "mixture.json").write_text("{}")
    one = TrainingLaunchConfig(nproc_per_node=2)
    assert "--nnodes" not in training_command(one, tmp_path, tmp_path / "out", rendezvous_id="run-1")
    assert run_dir_for(tmp_path, one, tmp_path) != run_dir_for(tmp_path, launch, tmp_path)

    rendezvous = Rendezvous(nnodes=3, endpoint="head:29400", run_id="run-1")
    agent = rendezvous.agent_argv([*command[3:], "--ray-address", "ray://head:10001"], node_rank=2)
    assert agent.count("--nproc-per-node") == 1 and "--ray-address" not in " ".join(agent)
    assert agent[-4:] == ["--nnodes=3", "--node-rank=2", "--rdzv-endpoint=head:29400", "--rdzv-id=run-1"]
    assert rendezvous.torchrun_options(2, 2) == [
        "--nnodes=3",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=head:29400",
        "--rdzv-id=run-1",
        "--node-rank=2",
    ]
    with pytest.raises(ConfigError, match="must be host:port"):
        TrainingLaunchConfig(nnodes=2, rdzv_endpoint="head")
    with pytest.raises(ConfigError, match=r"nnodes: must be in \[1, 4096\], got 0"):
        TrainingLaunchConfig(nnodes=0)


def test_an_agent_starts_torchrun_on_its_node_of_the_rendezvous(monkeypatch):
    from torch.distributed import run as torchrun

    started = []
    monkeypatch.setattr(torchrun, "main", started.append)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    rendezvous = Rendezvous(nnodes=2, endpoint="127.0.0.1:5", run_id="r")
    agent = rendezvous.agent_argv(["--data", "d", "--out", "x"], node_rank=1)
    node = _rendezvous(parse_args(agent))
    assert node == (rendezvous, 1)
    _launch_workers(2, agent, "moe_dag.training", node)
    options = rendezvous.torchrun_options(2, 1)
    assert started == [[*options, "-m", "moe_dag.training", "--data", "d", "--out", "x"]]


def test_the_node_on_whose_address_the_launcher_chose_the_port_hosts_the_store():
    rendezvous = Rendezvous(nnodes=2, endpoint="10.0.0.7:4000", run_id="r", host_node=0)
    agent = rendezvous.agent_argv(["--data", "d", "--out", "x"], node_rank=1)
    node = _rendezvous(parse_args(agent))
    assert node == (rendezvous, 1)
    assert "--rdzv-conf=is_host=0" in rendezvous.torchrun_options(1, 1)
    assert "--rdzv-conf=is_host=1" in rendezvous.torchrun_options(1, 0)
    # An endpoint from the config: torch finds the host by the machines' names.
    given = Rendezvous(nnodes=2, endpoint="head:4000", run_id="r")
    assert not any(option.startswith("--rdzv-conf") for option in given.torchrun_options(1, 0))
