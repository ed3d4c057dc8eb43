"""No benchmark module is named like something importable from the environment.

`python benchmarks/kernels.py` once put benchmarks/ first on sys.path, where `kernels.py` hid Hugging
Face's `kernels` package, so every benchmark importing transformers died at import. The benchmarks are
now modules of the `benchmarks` package (`python -m benchmarks.NAME`); this keeps their names clear of
installed top-level packages and the standard library too, so a script run the old way, or a package
installed later under a benchmark's name, is caught here rather than in a benchmark run.
"""

from __future__ import annotations

import importlib.metadata
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def environment_top_level_names() -> set[str]:
    """Top-level names the environment can import: every installed distribution's (by its metadata and
    by what lies in site-packages) and the standard library's, leaving out the repository's own folders."""
    own_folders = [ROOT, BENCHMARKS, ROOT / "tests"]
    search_path = [entry for entry in sys.path if entry and Path(entry).resolve() not in own_folders]
    names = set(importlib.metadata.packages_distributions())
    names |= {module.name for module in pkgutil.iter_modules(search_path)}
    return names | set(sys.stdlib_module_names)


def test_the_check_sees_the_package_that_was_shadowed() -> None:
    assert "kernels" in environment_top_level_names(), "transformers' `kernels` is no longer installed"


def test_no_benchmark_module_is_named_like_an_installed_package() -> None:
    modules = {path.stem for path in BENCHMARKS.glob("*.py")} - {"__init__"}
    clashes = sorted((modules | {BENCHMARKS.name}) & environment_top_level_names())
    assert not clashes, f"benchmarks/ modules named like installed packages (rename them): {clashes}"
    assert (BENCHMARKS / "__init__.py").is_file(), "benchmarks/ must stay a package run as modules"
