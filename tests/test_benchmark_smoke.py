"""Every benchmark runs at its smallest size (`--smoke`) and ends with the JSON line its row in
benchmarks/README.md promises: the keys listed after `JSON:` in that row. A benchmark whose row says it
needs CUDA ("Without CUDA ...") prints its skip line instead on a machine without one.

No other test runs a benchmark, so before these a benchmark could die at import (benchmarks/kernels.py
hid transformers' `kernels`) with every test green. The figures of a smoke run mean nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
# Minutes each on 2 quiet cores, against seconds for the rest: Ray or torchrun start-ups, whole-graph runs.
SLOW = {
    "data_plane",
    "scale",
    "incremental",
    "mixture_search",
    "curation_gain",
    "expert_parallel",
    "language_id",
    "toxicity",
}


def readme_rows() -> dict[str, str]:
    """Benchmark name -> its row's text, from the table in benchmarks/README.md."""
    rows = re.findall(r"^\| `(\w+)\.py` \|(.*)$", README.read_text(), flags=re.MULTILINE)
    return dict(rows)


def promised_keys(row: str) -> set[str]:
    """The backticked names in the row's `JSON:` sentence (up to the next full stop)."""
    match = re.search(r"JSON(?: keys)?:(.*?)(?:\.\s|\.\s*\||$)", row)
    assert match, f"benchmarks/README.md: the row has no 'JSON:' list of keys: {row[:80]}"
    return set(re.findall(r"`(\w+)`", match.group(1)))


def benchmark_names() -> list[str]:
    scripts = (path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.stem.startswith("_"))
    return sorted(name for name in scripts if name != "run_all")


def test_every_benchmark_has_a_readme_row() -> None:
    assert sorted(readme_rows()) == benchmark_names()


def smoke_params() -> list:
    return [
        pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [], id=name)
        for name in benchmark_names()
    ]


@pytest.mark.parametrize("name", smoke_params())
def test_a_smoke_run_ends_with_the_promised_json_line(name: str) -> None:
    row = readme_rows()[name]
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"python -m benchmarks.{name} --smoke failed:\n{done.stderr[-3000:]}"
    last_line = done.stdout.strip().splitlines()[-1]
    result = json.loads(last_line)
    assert result["bench"] == name
    if "Without CUDA" in row and not torch.cuda.is_available():
        assert result["device"] == "cpu" and result["skipped"] == "no CUDA device", last_line
        return
    missing = promised_keys(row) - set(result)
    assert not missing, f"benchmarks.{name} --smoke: keys its README row promises are missing: {missing}"
