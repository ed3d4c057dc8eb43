"""The trainer's allocator setting: freed large tensors' memory is reused, not mapped afresh."""

from __future__ import annotations

import resource

import pytest
import torch

from moe_dag.training.allocator import keep_freed_memory


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_freed_large_tensors_are_reused_without_faulting_their_pages_in_again() -> None:
    if not keep_freed_memory():
        pytest.skip("the C library is not glibc")
    before = minor_faults()
    for _ in range(10):  # 64 MiB (16,384 pages of 4 KiB) made and freed, as a training step's logits are
        torch.ones(2**24)
    # Mapped afresh each time (glibc's default), the pages fault in 10 times: 163,840 faults. Reused, they
    # fault in while the heap grows to fit the tensor (once or twice), then no more.
    assert minor_faults() - before < 4 * 16_384
