"""The `--smoke` option of every benchmark: its smallest size, so that a run takes seconds and shows only
that the script still works end to end and prints the JSON line its README row promises. The figures of
a smoke run mean nothing; tests/test_benchmark_smoke.py runs every benchmark so. (A helper, not a
benchmark: run_all skips modules whose names start with an underscore.)"""

from __future__ import annotations

import argparse


def parse_with_smoke(
    parser: argparse.ArgumentParser, smallest: dict[str, object], argv: list[str] | None = None
) -> argparse.Namespace:
    """Parse `argv` with a `--smoke` flag added; under it, each option named in `smallest` (by its
    attribute name, e.g. `docs_per_source`) takes that value, whatever the command line said."""
    sizes = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in smallest.items())
    parser.add_argument("--smoke", action="store_true", help=f"the smallest size, in seconds: {sizes}")
    args = parser.parse_args(argv)
    unknown = sorted(set(smallest) - set(vars(args)))
    if unknown:
        raise ValueError(f"{parser.prog}: smoke sizes for options it does not have: {unknown}")
    if args.smoke:
        vars(args).update(smallest)
    return args
