"""Training on several nodes: one torchrun agent per node, meeting through torchrun's c10d rendezvous.

`python -m moe_dag.training --nnodes N --nproc-per-node P ...` is the launcher. It starts one agent per
node (the same command with `--node-rank R`); each agent runs torchrun's launcher in its own process
(`--nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID --node-rank R`), which starts
its P workers. The N agents meet at the endpoint and number the N x P workers; then training runs as
on one node, every rank reading and writing the one run folder.

Where the agents run:
- given a Ray cluster (`--ray-address`), one Ray task per agent in a placement group of N bundles with
  the STRICT_SPREAD strategy, so no two agents share a machine; the default endpoint is node 0's
  address. The run folder must be on storage every node mounts at the same path (NFS, Lustre, ...):
  each agent checks that it sees a token the launcher wrote there before it starts, and fails if not.
- otherwise all N agents on this machine (tests, the demo): N "nodes" that share its disk.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from moe_dag.training.lifeline import launcher_env

log = logging.getLogger("moe_dag.training")

# The launcher's own options: each agent receives them explicitly, its workers not at all.
NODE_OPTIONS = (
    "--nnodes",
    "--node-rank",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--rdzv-host-node",
    "--ray-address",
)
SHARED_TOKEN_FILE = ".shared_storage_token"  # written by the launcher, read by every agent
PIPES_ENV_PREFIX = "DAGSTER_PIPES_"
# The launcher's settings an agent on another machine takes (the rest of its environment is its node's).
FORWARDED_ENV_PREFIXES = (
    "WANDB_",
    "NCCL_",
    "TORCH_",
    "OMP_",
    "HF_",
)  # Dagster's Pipes channel lives on the launcher's machine only


@dataclass(kw_only=True, frozen=True, slots=True)
class Rendezvous:
    nnodes: int
    endpoint: str  # host:port of the c10d store (hosted by the agent whose machine has that host)
    run_id: str  # the same for every agent of one run, new for the next
    # The node whose agent hosts the store, when the launcher chose the endpoint on it. None: torch's
    # guess, the agent whose machine's names include the endpoint's host (for an endpoint given in the
    # config); a node address Ray reports need not be among a machine's names, and then no agent hosts.
    host_node: int | None = None

    def torchrun_options(self, nproc_per_node: int, node_rank: int) -> list[str]:
        hosting = (
            [] if self.host_node is None else [f"--rdzv-conf=is_host={int(node_rank == self.host_node)}"]
        )
        return [
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
            *hosting,
            f"--node-rank={node_rank}",
        ]

    def agent_argv(self, argv: list[str], node_rank: int) -> list[str]:
        """The launcher's arguments for the agent of `node_rank`: the rendezvous fixed, no Ray address."""
        kept = without_options(argv, NODE_OPTIONS)
        return [
            *kept,
            f"--nnodes={self.nnodes}",
            f"--node-rank={node_rank}",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
            *([] if self.host_node is None else [f"--rdzv-host-node={self.host_node}"]),
        ]


def without_options(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`argv` less every `--option value` and `--option=value` of `options`."""
    kept, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
        elif arg in options:
            skip_next = True
        elif not any(arg.startswith(option + "=") for option in options):
            kept.append(arg)
    return kept


def free_local_endpoint() -> str:
    """A port free on this machine now (the agent that hosts the store binds it moments later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def agent_env() -> dict[str, str]:
    """The agents' environment: this one, less Dagster's Pipes channel (the launcher reports, not the
    workers: on another machine they could not reach it), and tied to this process's life."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(PIPES_ENV_PREFIX)}
    return env | launcher_env()


def run_local_agents(rendezvous: Rendezvous, argv: list[str], module: str) -> int:
    """Start every node's agent on this machine and wait for all; the first non-zero exit status, or 0."""
    env = agent_env()
    agents = [
        subprocess.Popen([sys.executable, "-m", module, *rendezvous.agent_argv(argv, rank)], env=env)
        for rank in range(rendezvous.nnodes)
    ]
    codes = [agent.wait() for agent in agents]
    return next((code for code in codes if code != 0), 0)


def run_ray_agents(
    rendezvous_endpoint: str | None,
    rendezvous_id: str,
    argv: list[str],
    module: str,
    *,
    nnodes: int,
    ray_address: str,
    out_dir: Path,
    gpus_per_node: int,
) -> int:
    """One agent per node of the Ray cluster at `ray_address` (STRICT_SPREAD: never two on one node),
    each holding its bundle's CPU and GPUs so its workers see the node's GPUs Ray gave it."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    token = secrets.token_hex(16)
    (out_dir / SHARED_TOKEN_FILE).write_text(token)
    ray.init(address=ray_address, ignore_reinit_error=True)
    bundle = {"CPU": 1} | ({"GPU": gpus_per_node} if gpus_per_node else {})
    group = placement_group([bundle] * nnodes, strategy="STRICT_SPREAD")
    try:
        ray.get(group.ready(), timeout=600)

        def on_node(rank: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=rank)

        if rendezvous_endpoint is None:
            endpoint = ray.get(
                ray.remote(num_cpus=0)(_node_endpoint).options(scheduling_strategy=on_node(0)).remote()
            )
            rendezvous = Rendezvous(nnodes=nnodes, endpoint=endpoint, run_id=rendezvous_id, host_node=0)
        else:
            rendezvous = Rendezvous(nnodes=nnodes, endpoint=rendezvous_endpoint, run_id=rendezvous_id)
        agent = ray.remote(_agent)
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        agents = [
            agent.options(scheduling_strategy=on_node(rank), num_cpus=1, num_gpus=gpus_per_node).remote(
                ["-m", module, *rendezvous.agent_argv(argv, rank)], forwarded, str(out_dir), token
            )
            for rank in range(nnodes)
        ]
        finished = ray.get(agents)
    finally:
        remove_placement_group(group)
    for rank, (node, code) in enumerate(finished):
        log.info("node %d's agent ran on Ray node %s and exited with status %d", rank, node, code)
    return next((code for _, code in finished if code != 0), 0)


def _node_endpoint() -> str:
    """This node's address and a port free on it."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"


def _agent(arguments: list[str], forwarded: dict[str, str], out_dir: str, token: str) -> tuple[str, int]:
    """On its node: the agent under this node's Python and environment, plus the launcher's settings;
    returns the Ray node id and the agent's exit status."""
    import ray

    seen = Path(out_dir) / SHARED_TOKEN_FILE
    if not seen.exists() or seen.read_text() != token:
        raise RuntimeError(
            f"{socket.gethostname()} does not see the launcher's run folder {out_dir}: several nodes need "
            "the lake on storage every node mounts at the same path"
        )
    # The Ray worker is this agent's launcher: the agent and its workers die with it. Ray's
    # CUDA_VISIBLE_DEVICES (this bundle's GPUs) passes on to the workers.
    env = dict(os.environ) | forwarded | launcher_env()
    code = subprocess.run([sys.executable, *arguments], env=env, check=False).returncode
    return ray.get_runtime_context().get_node_id(), code
