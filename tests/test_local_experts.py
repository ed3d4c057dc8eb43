"""Experts built only where they live: a rank narrows the meta model's experts to its slice, then
materialises it, and holds exactly what the whole build gives (every parameter, and the generator left
where the whole build leaves it), while allocating only the non-expert parameters and its own experts.
The same over gloo ranks through `Parallelism` is in test_expert_parallel.py's `check_training`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from moe_dag.training.config import ModelConfig, preset, tiny
from moe_dag.training.model import Transformer, build_model, materialise, meta_model
from moe_dag.training.slice_init import PIECE, normal_rows_


def _drawn_rows(total_rows: int, row_shape: tuple[int, ...], first: int, count: int, **kw) -> tuple:
    torch.manual_seed(3)
    rows = normal_rows_(torch.empty(count, *row_shape), 0.02, first_row=first, total_rows=total_rows, **kw)
    return rows, torch.rand(4)  # what the generator draws next


@pytest.mark.parametrize(
    ("total_rows", "row_shape", "first", "count", "piece"),
    [
        (8, (32, 32), 2, 2, 16 * 48),  # rows on piece edges
        (8, (32, 32), 6, 2, 16 * 45),  # pieces straddle the kept rows, which end the tensor
        (5, (7, 3), 1, 3, 16),  # rows of 21 elements: groups of 16 cross rows
        (5, (7, 3), 4, 1, 32),  # 105 elements: torch redraws the last 16, inside the kept row
        (3, (5,), 1, 1, 16),  # 15 elements, below torch's group of 16: drawn whole
        (6, (4, 4), 0, 6, 16),  # every row
    ],
)
def test_rows_drawn_alone_equal_the_rows_of_the_whole_draw(total_rows, row_shape, first, count, piece):
    torch.manual_seed(3)
    whole = nn.init.normal_(torch.empty(total_rows, *row_shape), std=0.02)
    after_whole = torch.rand(4)
    rows, after_rows = _drawn_rows(total_rows, row_shape, first, count, piece=piece)
    assert torch.equal(rows, whole[first : first + count])
    assert torch.equal(after_rows, after_whole)


def test_rows_outside_the_stack_are_refused() -> None:
    with pytest.raises(ValueError, match=r"rows \[3, 5\) are not within 4 rows"):
        normal_rows_(torch.empty(2, 4), 0.02, first_row=3, total_rows=4)


def _local_build(config: ModelConfig, first: int, count: int) -> Transformer:
    model = meta_model(config)
    for moe in model.moe_layers():
        moe.experts.keep(first, count)
    return materialise(model, "cpu")


@pytest.mark.parametrize("first", [0, 2])
def test_a_ranks_experts_and_every_other_parameter_equal_the_whole_builds(first: int) -> None:
    config = tiny().model  # 4 experts, 2 per "rank"
    torch.manual_seed(0)
    whole = build_model(config)
    after_whole = torch.rand(4)
    torch.manual_seed(0)
    local = _local_build(config, first, 2)
    assert torch.equal(torch.rand(4), after_whole)
    whole_state = whole.state_dict()
    for name, value in local.state_dict().items():
        expected = whole_state[name]
        if ".experts." in name:
            assert value.shape[0] == 2
            expected = expected[first : first + 2]
        assert torch.equal(value, expected), name


def test_experts_are_narrowed_once() -> None:
    experts = meta_model(tiny().model).moe_layers()[0].experts
    experts.keep(2, 2)
    with pytest.raises(ValueError, match="already narrowed"):
        experts.keep(0, 2)


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def _tensor_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)


def test_a_rank_allocates_its_experts_and_the_dense_parts_not_the_whole_model() -> None:
    """A ~180M-parameter model (143M of it experts) as rank 2 of EP=8: what it holds after the build is
    the non-expert parameters and buffers plus an eighth of the experts, and the peak resident memory of
    the build (Linux's VmHWM, reset before it) stays within that plus the initialiser's scratch, far
    below the whole model, which is never allocated."""
    clear_refs = Path("/proc/self/clear_refs")
    if not clear_refs.exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident memory")
    base = preset("demo").model
    config = dataclasses.replace(base, d_model=512, n_layers=8, num_experts=32, expert_hidden=384)
    ep = 8
    shapes = meta_model(config)
    expert_bytes = sum(p.numel() * 4 for moe in shapes.moe_layers() for p in moe.experts.parameters())
    whole_bytes = sum(t.numel() * t.element_size() for t in [*shapes.parameters(), *shapes.buffers()])
    expected = whole_bytes - expert_bytes + expert_bytes // ep
    assert expert_bytes > 0.75 * whole_bytes  # the experts are most of the model

    clear_refs.write_text("5")  # the peak resident set restarts from the current one
    before = _kib("VmRSS")
    torch.manual_seed(0)
    model = _local_build(config, 2 * config.num_experts // ep, config.num_experts // ep)
    peak_growth = (_kib("VmHWM") - before) * 1024

    assert _tensor_bytes(model) == expected
    # Beyond the tensors: one piece of scratch, and what the allocator keeps of freed ones (9-17 MiB
    # measured over 6 runs).
    assert peak_growth < expected + 4 * PIECE + 64 * 2**20, (peak_growth, expected, whole_bytes)
    assert peak_growth < whole_bytes / 3
