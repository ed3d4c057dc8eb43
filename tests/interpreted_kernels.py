"""Runs a kernel test module's cases through Triton's interpreter in a child Python, for its assertions.

Triton picks compiled or interpreted when a kernel is decorated, that is when moe_dag.kernels is first
imported, and the choice holds for the whole process. So each kernel test module, run as a script with
TRITON_INTERPRET=1, runs its kernels and saves inputs and results; the assertions run in the test
process. Setting the variable in the test process instead would leak into every test that runs after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch


def run_interpreted(test_file: str, out_dir: Path, timeout_s: float = 300) -> dict:
    """Run `test_file` as `python test_file OUT` under TRITON_INTERPRET=1; returns what it saved to OUT."""
    out_path = out_dir / "cases.pt"
    child = subprocess.run(
        [sys.executable, test_file, str(out_path)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    return torch.load(out_path)
