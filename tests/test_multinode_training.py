"""Training over several nodes: hybrid sharding (FSDP2 over a (nodes, processes per node) mesh) follows
one process step by step, with and without expert parallelism; and the `moe_proxy` asset's launch of 2
"nodes" x 2 processes over gloo, every node's torchrun agent on this machine, meeting by c10d rendezvous.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_expert_parallel import check_training, spawn
from test_trainer import SEQ_LEN, write_mixture
from torch.distributed.tensor import Replicate, Shard

from moe_dag.assets.training import moe_proxy
from moe_dag.config import load_config
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.storage.lake import Lake
from moe_dag.training.config import ParallelConfig, tiny
from moe_dag.training.distributed import DistInfo
from moe_dag.training.model import build_model
from moe_dag.training.multinode import SHARED_TOKEN_FILE, _agent
from moe_dag.training.parallelize import Parallelism
from tests.pipeline_configs import Replace

NODES, PER_NODE = 2, 2


def _two_nodes_of_two(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    info = DistInfo(
        rank=rank,
        world_size=world,
        local_rank=rank % PER_NODE,
        local_world_size=PER_NODE,
        device=torch.device("cpu"),
    )
    try:
        hybrid = ParallelConfig(data_parallel="hsdp")
        model = build_model(tiny().model)
        Parallelism(hybrid, info).wrap(model)
        embedding = next(model.parameters())
        assert embedding.device_mesh.shape == (NODES, PER_NODE)
        assert embedding.placements == (Replicate(), Shard(0))  # replicated over nodes, sharded within
        check_training(info, hybrid, grad_accum_steps=2, grad_clip=0.05)
        # EP groups of 2 consecutive ranks (one node's), experts replicated across the nodes.
        check_training(info, ParallelConfig(ep=2, data_parallel="hsdp"), grad_accum_steps=1, grad_clip=0.05)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_hybrid_sharding_over_two_nodes_of_two_follows_one_process() -> None:
    spawn(_two_nodes_of_two, NODES * PER_NODE)


@pytest.fixture
def two_node_pipeline(make_config) -> Path:
    """configs/demo.yaml with a fresh lake holding a small tokenized mixture, and tiny training on 2
    "nodes" of 2 processes each with hybrid sharding (no Ray address: both agents on this machine)."""
    overrides = {
        "train.num_threads": 1,
        "train.batch_size": 2,
        "train.checkpoint_every": 2,
        "parallel.data_parallel": "hsdp",
    }
    training = Replace(preset="tiny", steps=4, nnodes=NODES, nproc_per_node=PER_NODE, overrides=overrides)
    path = make_config({"training": training})
    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    write_mixture(Lake(load_config(path).lake_root).artifact_dir("tokenized_mixture"), rows)
    return path


@pytest.mark.slow
def test_moe_proxy_trains_on_two_nodes_of_two_processes(two_node_pipeline: Path) -> None:
    resources = build_definitions(two_node_pipeline).resources
    result = dg.materialize([moe_proxy], resources=resources, selection=["moe_proxy"])
    trained = result.asset_materializations_for_node("moe_proxy")[0].metadata
    # 2 processes per agent and 4 ranks: torchrun numbered the workers of both nodes' agents.
    assert trained["world_size"].value == NODES * PER_NODE and trained["steps"].value == 4
    run_dir = Path(trained["run_dir"].value)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["config"]["parallel"]["data_parallel"] == "hsdp"
    assert Path(summary["checkpoint"]).name == "step_4" and (run_dir / "eval.json").exists()
    assert trained["heldout_documents"].value == 2


def test_an_agent_that_does_not_see_the_run_folder_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / SHARED_TOKEN_FILE).write_text("another launcher's token")
    with pytest.raises(RuntimeError, match="does not see the launcher's run folder"):
        _agent(["-c", "raise SystemExit(0)"], {}, str(tmp_path), "this launcher's token")
    with pytest.raises(RuntimeError, match="several nodes need the lake on storage every node mounts"):
        _agent(["-c", "raise SystemExit(0)"], {}, str(tmp_path / "elsewhere"), "this launcher's token")


@pytest.mark.slow
def test_on_a_ray_cluster_each_nodes_agent_runs_on_its_own_node(tmp_path: Path) -> None:
    """A Ray cluster of a CPU-less head and two 1-CPU workers on this machine (separate node ids):
    given its address, the launcher places the two agents on the two workers, and they train together."""
    from ray.cluster_utils import Cluster

    data = write_mixture(tmp_path / "data", (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)) % 12 + 1)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 << 20})
    try:
        workers = {cluster.add_node(num_cpus=1, object_store_memory=80 << 20).node_id for _ in range(2)}
        command = [
            sys.executable,
            "-m",
            "moe_dag.training",
            "--data",
            str(data),
            "--out",
            str(tmp_path / "run"),
        ]
        command += ["--preset", "tiny", "--steps", "2", "--nnodes", "2", "--ray-address", cluster.address]
        for setting in ("train.batch_size=2", "train.num_threads=1", "train.checkpoint_every=2"):
            command += ["--set", setting]
        child = subprocess.run(
            command, capture_output=True, text=True, timeout=600, env={**os.environ, "WANDB_MODE": "disabled"}
        )
    finally:
        cluster.shutdown()
    assert child.returncode == 0, child.stderr[-4000:]
    placed = set(re.findall(r"agent ran on Ray node (\w+)", child.stderr))
    assert placed == workers  # one agent on each worker node
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and Path(summary["checkpoint"]).name == "step_2"
