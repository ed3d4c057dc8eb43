"""Expert parallelism over gloo: the EP MoE layer against the single-process layer, forward and backward
(experts that receive no tokens, ranks that send none, capacity drops, FP8 dispatch), data parallelism
around it (DDP with gradient accumulation, FSDP2 with expert replicas), and through the training entry
point: EP=2 losses equal EP=1 step by step, and checkpoints reshard EP=2 -> EP=1 and EP=1 -> EP=2.
Split models are built with their experts narrowed on the meta device, as the trainer builds them, and
start from exactly the whole build's weights.

Process tests spawn one group of ranks per world size and run every case in it (starting processes is
most of their cost on a loaded machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_dag.training.checkpoint import latest_checkpoint, load_model
from moe_dag.training.config import Config, ParallelConfig, tiny
from moe_dag.training.distributed import DistInfo
from moe_dag.training.expert_parallel import ExpertParallelDispatch
from moe_dag.training.load_balance import ExpertBiasUpdater
from moe_dag.training.model import Transformer, build_model, materialise, meta_model
from moe_dag.training.optim import build_optimizer, build_scheduler
from moe_dag.training.parallelize import Parallelism
from moe_dag.training.precision import build_recipe
from moe_dag.training.synthetic import SyntheticBatches
from moe_dag.training.trainer import train, train_step
from tests.local_processes import free_port

NUM_EXPERTS, D_MODEL = 8, 32


def layer_config(**changes: object) -> Config:
    config = tiny()
    model = dataclasses.replace(
        config.model, num_experts=NUM_EXPERTS, d_model=D_MODEL, n_layers=1, first_dense_layers=0, **changes
    )
    return dataclasses.replace(config, model=model)


def one_layer(config: Config, bias: torch.Tensor | None) -> Transformer:
    torch.manual_seed(0)
    model = build_model(config.model).train()
    if bias is not None:
        model.moe_layers()[0].router.expert_bias_E.copy_(bias)
    return model


def inputs(tokens_per_rank: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's tokens and the gradient arriving at its output, the same on every rank."""
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, n, D_MODEL, generator=generator) for n in tokens_per_rank]
    upstream = [torch.randn(1, n, D_MODEL, generator=generator) for n in tokens_per_rank]
    return xs, upstream


def named(name: str):
    return lambda message: f"{name}: {message}"


def assert_fp32_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Equal up to float32 rounding of sums taken in another order (over ranks, then over tokens)."""
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4, msg=named(name))


# ---------------------------------------------------------------- in one process


@pytest.mark.parametrize("capacity_factor", [None, 0.5])
def test_expert_parallel_dispatch_of_one_rank_equals_the_local_dispatch(capacity_factor) -> None:
    config = layer_config(capacity_factor=capacity_factor)
    local, split = one_layer(config, None), one_layer(config, None)
    moe = split.moe_layers()[0]
    moe.dispatch = ExpertParallelDispatch(
        None, num_experts=NUM_EXPERTS, drops_pairs=capacity_factor is not None, fp8=False
    )
    (x,), (upstream,) = inputs([40])
    for model in (local, split):
        model.moe_layers()[0](x).backward(upstream)
    torch.testing.assert_close(split.moe_layers()[0](x), local.moe_layers()[0](x), rtol=0, atol=0)
    for (name, a), b in zip(local.named_parameters(), split.parameters(), strict=True):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=named(name))


def test_parallel_config_refuses_sizes_that_do_not_divide() -> None:
    info = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="parallel.ep=2 must divide the number of processes"):
        Parallelism(ParallelConfig(ep=2), info)
    with pytest.raises(ValueError, match="parallel.ep=0 must be at least 1"):
        ParallelConfig(ep=0)
    with pytest.raises(ValueError, match="num_experts=8 must be divisible by parallel.ep=3"):
        ExpertParallelDispatch(_FakeMesh(3), num_experts=8, drops_pairs=False, fp8=False)


class _FakeMesh:
    """A mesh with an "ep" dimension of `ep` ranks, without a process group: for the divisibility check."""

    def __init__(self, ep: int) -> None:
        self.ep = ep

    def __getitem__(self, name: str) -> _FakeMesh:
        return self

    def size(self) -> int:
        return self.ep


# ---------------------------------------------------------------- spawned gloo ranks


def spawn(worker, world: int) -> None:
    mp.spawn(worker, args=(world, free_port()), nprocs=world, join=True)


def _join(rank: int, world: int, port: int) -> DistInfo:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return DistInfo(
        rank=rank, world_size=world, local_rank=rank, local_world_size=world, device=torch.device("cpu")
    )


def check_layer(
    info: DistInfo,
    parallel: Parallelism,
    tokens_per_rank: list[int],
    *,
    bias: torch.Tensor | None = None,
    fp8: bool = False,
    capacity_factor: float | None = None,
) -> None:
    """This rank's EP layer against one process running the whole layer on every rank's tokens."""
    config = layer_config(capacity_factor=capacity_factor)
    reference, model = one_layer(config, bias), one_layer(config, bias)
    if fp8:  # the same rounding in one process: FP8 dispatch to a group of one
        reference.moe_layers()[0].dispatch = ExpertParallelDispatch(
            None, num_experts=NUM_EXPERTS, drops_pairs=capacity_factor is not None, fp8=True
        )
    parallel.shard_experts(model)
    xs, upstream = inputs(tokens_per_rank)

    xs_ref = [x.clone().requires_grad_() for x in xs]
    ys_ref = [reference.moe_layers()[0](x) for x in xs_ref]
    torch.autograd.backward(ys_ref, upstream)
    x = xs[info.rank].clone().requires_grad_()
    y = model.moe_layers()[0](x)
    y.backward(upstream[info.rank])

    assert_fp32_close(y, ys_ref[info.rank], "output")
    assert_fp32_close(x.grad, xs_ref[info.rank].grad, "input gradient")
    experts = {id(p) for p in parallel.expert_parameters(model)}
    layer, reference_layer = model.moe_layers()[0], reference.moe_layers()[0]
    for parameter in layer.parameters():
        if id(parameter) not in experts:  # dense: averaged over ranks, as DDP does
            dist.all_reduce(parameter.grad)
            parameter.grad /= info.world_size
    grad_norm = parallel.finish_gradients(model)
    local = slice(layer.dispatch.first_expert, layer.dispatch.first_expert + layer.dispatch.local_experts)
    for (name, parameter), expected in zip(
        layer.named_parameters(), reference_layer.parameters(), strict=True
    ):
        # What one process computes on every rank's tokens, over the world size (DDP's mean).
        if id(parameter) in experts:
            torch.testing.assert_close(parameter.detach(), expected.detach()[local], rtol=0, atol=0)
            assert_fp32_close(parameter.grad * info.world_size, expected.grad[local], name)
        else:
            assert_fp32_close(parameter.grad * info.world_size, expected.grad, name)
    ref_grads = [p.grad for p in reference_layer.parameters()]
    expected_norm = torch.nn.utils.get_total_norm(ref_grads) / info.world_size
    assert_fp32_close(grad_norm, expected_norm, "gradient norm")

    # The bias update sees the load of every rank's tokens, so every rank keeps the reference's biases.
    ExpertBiasUpdater(model.moe_layers(), 0.1, all_reduce=dist.all_reduce).update()
    ExpertBiasUpdater(reference.moe_layers(), 0.1).update()
    bias_E = model.moe_layers()[0].router.expert_bias_E
    torch.testing.assert_close(bias_E, reference.moe_layers()[0].router.expert_bias_E)


# Experts 4..7 live on the second of two ranks (the third and fourth of four); -10 keeps them idle.
IDLE_SECOND_HALF = torch.tensor([0.0] * 4 + [-10.0] * 4)
IDLE_TWO = torch.tensor([0.0, 0.0, 0.0, -10.0, 0.0, 0.0, 0.0, -10.0])


def _two_rank_worker(rank: int, world: int, port: int) -> None:
    info = _join(rank, world, port)
    try:
        parallel = Parallelism(ParallelConfig(ep=2), info)
        check_layer(info, parallel, [24, 20])
        check_layer(info, parallel, [24, 20], bias=IDLE_TWO)  # experts 3 and 7 receive no tokens
        check_layer(info, parallel, [16, 20], bias=IDLE_SECOND_HALF)  # rank 1 receives nothing
        check_layer(info, parallel, [24, 0])  # rank 1 has no tokens: it sends none
        check_layer(info, parallel, [24, 16], capacity_factor=0.5)
        check_layer(info, Parallelism(ParallelConfig(ep=2, fp8_dispatch=True), info), [24, 20], fp8=True)
        check_training(info, ParallelConfig(ep=2), grad_accum_steps=2)
    finally:
        dist.destroy_process_group()


def _four_rank_worker(rank: int, world: int, port: int) -> None:
    info = _join(rank, world, port)
    try:
        parallel = Parallelism(ParallelConfig(ep=4), info)
        check_layer(info, parallel, [24, 0, 16, 8], bias=IDLE_TWO)
        check_layer(info, parallel, [12, 20, 16, 8], bias=IDLE_SECOND_HALF)  # ranks 2, 3 receive nothing
        replicated = Parallelism(ParallelConfig(ep=2), info)  # 2 EP groups of 2, experts in 2 replicas
        check_layer(info, replicated, [24, 20, 0, 12])
        check_training(info, ParallelConfig(ep=2, data_parallel="fsdp"), grad_accum_steps=1, grad_clip=0.05)
    finally:
        dist.destroy_process_group()


class _RankSlice:
    """Rank r's share of every global batch (what `TrainBatches` gives each data-parallel rank)."""

    def __init__(self, batches: SyntheticBatches, rank: int, world: int) -> None:
        self.batches, self.rank, self.world = batches, rank, world

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.chunk(self.world)[self.rank] for t in self.batches.next_batch())


def check_training(
    info: DistInfo, parallel_config: ParallelConfig, grad_accum_steps: int, grad_clip: float | None = None
) -> None:
    """`train_step` on this rank's slice of each batch follows one process on the whole batches. The
    split model is built as the trainer builds it, experts narrowed on the meta model, and starts from
    exactly the whole build's weights."""
    steps = 3
    config = tiny()
    config = dataclasses.replace(
        config,
        parallel=parallel_config,
        optim=dataclasses.replace(config.optim, grad_clip=grad_clip),
        train=dataclasses.replace(
            config.train, batch_size=2 * info.world_size, grad_accum_steps=grad_accum_steps
        ),
    )
    losses, initial = [], {}
    for parallel in (None, Parallelism(parallel_config, info)):
        torch.manual_seed(0)
        recipe = build_recipe(config.precision)
        if parallel is None:
            model = build_model(config.model)
            initial = {name: value.clone() for name, value in model.state_dict().items()}
        else:
            model = meta_model(config.model)
            parallel.shard_experts(model)
            materialise(model, info.device)
            assert_whole_builds_slice(model, initial)
        wrapped = model if parallel is None else parallel.wrap(model)
        optimizer = build_optimizer(model, config.optim)
        all_reduce = None if parallel is None else dist.all_reduce
        ExpertBiasUpdater(model.moe_layers(), 1e-2, all_reduce=all_reduce).register(optimizer)
        scheduler = build_scheduler(optimizer, steps, config.optim)
        batches = SyntheticBatches(
            config.model.vocab_size, config.model.seq_len, batch_size=2 * info.world_size, seed=0
        )
        source = batches if parallel is None else _RankSlice(batches, info.rank, info.world_size)
        losses.append(
            [
                train_step(
                    wrapped, optimizer, scheduler, source, config, info.device, recipe, parallel=parallel
                )
                for _ in range(steps)
            ]
        )
    single, split = losses
    for (loss_a, norm_a), (loss_b, norm_b) in zip(single, split, strict=True):
        assert loss_b == pytest.approx(loss_a, rel=1e-5)
        assert norm_b == pytest.approx(norm_a, rel=1e-4)
    if grad_clip is not None:
        assert max(norm for _, norm in single) > grad_clip  # clipping took part


def assert_whole_builds_slice(model: Transformer, whole: dict[str, torch.Tensor]) -> None:
    """Every tensor of `model` equals the whole build's, its experts the rows of this rank's slice."""
    for name, value in model.state_dict().items():
        expected = whole[name]
        if value.shape != expected.shape:  # a stacked expert weight: [local experts, ...]
            experts = model.get_submodule(name.rsplit(".", 1)[0])
            expected = expected[experts.first_expert : experts.first_expert + value.shape[0]]
        assert torch.equal(value, expected), name


@pytest.mark.slow
def test_two_ranks_of_experts_equal_one_process() -> None:
    spawn(_two_rank_worker, 2)


@pytest.mark.slow
def test_four_ranks_of_experts_equal_one_process() -> None:
    spawn(_four_rank_worker, 4)


# ---------------------------------------------------------------- the training entry point


@pytest.fixture
def repeating_data(tmp_path: Path) -> Path:
    from test_trainer import SEQ_LEN, write_mixture

    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    return write_mixture(tmp_path / "data", rows)


def torchrun_ep2(data: Path, out: Path, steps: int) -> None:
    """`torchrun --nproc-per-node 2 -m moe_dag.training` with 2 experts per rank, batch 2 per rank."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "moe_dag.training",
    ]
    command += ["--data", str(data), "--out", str(out), "--preset", "tiny", "--steps", str(steps)]
    for setting in ("parallel.ep=2", "train.batch_size=2", "train.checkpoint_every=2", "train.num_threads=1"):
        command += ["--set", setting]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    child = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert child.returncode == 0, child.stderr[-4000:]


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_ep2_training_follows_ep1_and_checkpoints_reshard_both_ways(repeating_data: Path, tmp_path: Path):
    """One process of batch 4 against 2 ranks of batch 2 with 2 experts each (the same global batches):
    the same losses step by step, also after a checkpoint was saved mid-run, and a checkpoint written
    at either EP size resumes at the other."""
    config = tiny()
    config = dataclasses.replace(
        config,
        train=dataclasses.replace(config.train, steps=4, batch_size=4, checkpoint_every=2, num_threads=1),
    )
    train(config, repeating_data, tmp_path / "ep1")
    reference = losses(tmp_path / "ep1")

    def resume_at_step_2(run: str, into: str) -> None:
        step_2 = Path("checkpoints") / "step_2"
        shutil.copytree(tmp_path / run / step_2, tmp_path / into / step_2)

    torchrun_ep2(repeating_data, tmp_path / "ep2", steps=4)  # trains on after saving step 2
    assert losses(tmp_path / "ep2") == pytest.approx(reference, rel=1e-5)

    # Each run saved step 2 mid-run (checkpoint_every 2): each resumes in a fresh folder at the other EP
    # size (no second EP=2 launch to save it: a launch is most of this test's time).
    resume_at_step_2("ep2", "ep2_then_ep1")
    train(config, repeating_data, tmp_path / "ep2_then_ep1")  # resumes EP=2's step 2 at EP=1
    assert losses(tmp_path / "ep2_then_ep1") == pytest.approx(reference, rel=1e-5)

    resume_at_step_2("ep1", "ep1_then_ep2")
    torchrun_ep2(repeating_data, tmp_path / "ep1_then_ep2", steps=4)  # resumes EP=1's step 2 at EP=2
    # Steps 1-2 come from the checkpoint's copy of the metrics, steps 3-4 from the EP=2 run.
    assert losses(tmp_path / "ep1_then_ep2") == pytest.approx(reference, rel=1e-5)
    summary = json.loads((tmp_path / "ep1_then_ep2" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["config"]["parallel"]["ep"] == 2

    # Evaluation reads a checkpoint saved at EP=2 whole, in one process.
    (ep2_model, _), (ep1_model, _) = (
        load_model(latest_checkpoint(tmp_path / run)) for run in ("ep1_then_ep2", "ep1")
    )
    for (name, a), b in zip(ep1_model.state_dict().items(), ep2_model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=named(name))
