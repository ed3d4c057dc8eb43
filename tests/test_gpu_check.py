"""`make gpu-check` on a machine without CUDA runs nothing, says what it would run (every benchmark that
needs CUDA, through run_all so it is recorded, and their tests) and exits 0."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine make gpu-check runs the benchmarks")
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_without_cuda_it_names_what_it_would_run_and_succeeds() -> None:
    results = ROOT / "benchmarks" / "results"
    records_before = {path.name: path.stat().st_size for path in results.glob("*.jsonl")}
    done = subprocess.run(["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("no CUDA device: nothing run")
    # Every benchmark whose README row says it needs CUDA is in the recorded run.
    needs_cuda = re.findall(
        r"^\| `(\w+)\.py` \|.*Without CUDA", (ROOT / "benchmarks" / "README.md").read_text(), re.M
    )
    assert sorted(needs_cuda) == ["kernel_speed", "scoring_gpu", "training_gpu"]
    (run_all,) = [line for line in lines if "-m benchmarks.run_all" in line]
    assert run_all.split("benchmarks.run_all")[1].split() == ["kernel_speed", "training_gpu", "scoring_gpu"]
    (tests,) = [line for line in lines if "-m pytest" in line]
    assert all(name in tests for name in needs_cuda)
    assert {path.name: path.stat().st_size for path in results.glob("*.jsonl")} == records_before
    assert (
        not (ROOT / "benchmarks" / "results" / "kernel_speed.jsonl").exists() or "recorded" not in done.stdout
    )
