"""benchmarks/run_all.py: each benchmark's last JSON line is recorded with its provenance, a failed or
malformed run records nothing, and the results table is regenerated between its markers only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

RUN_ALL = Path(__file__).resolve().parents[1] / "benchmarks" / "run_all.py"


@pytest.fixture
def run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_all_under_test", RUN_ALL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    benchmarks = tmp_path / "benchmarks"
    benchmarks.mkdir()
    (benchmarks / "run_all.py").write_text("")  # the runner itself is not a benchmark
    (benchmarks / "__init__.py").write_text("")  # nor is the package's own module
    monkeypatch.setattr(module, "BENCHMARKS", benchmarks)
    monkeypatch.setattr(module, "RESULTS", benchmarks / "results")
    monkeypatch.setattr(module, "DOC", tmp_path / "benchmarks.md")
    return module


def write_benchmark(run_all: ModuleType, name: str, body: str) -> None:
    script = f'"""{name}: a fake benchmark against a fake baseline."""\nimport sys\n{body}\n'
    (run_all.BENCHMARKS / f"{name}.py").write_text(script)


def test_a_run_is_recorded_with_its_provenance_and_tabled(run_all: ModuleType) -> None:
    write_benchmark(run_all, "fast", 'print("warming up")\nprint(\'{"bench": "fast", "ratio": 1.2345678}\')')
    old_table = f"{run_all.BEGIN}\nold table\n{run_all.END}"
    run_all.DOC.write_text(f"# Benchmarks\n\nhand-written\n\n{old_table}\n\ntail\n")

    assert run_all.main(["fast"]) == 0

    (record,) = [json.loads(line) for line in (run_all.RESULTS / "fast.jsonl").read_text().splitlines()]
    assert record["result"] == {"bench": "fast", "ratio": 1.2345678}
    assert len(record["commit"]) == 40
    assert record["machine"]["cores"] >= 1 and len(record["machine"]["load_average_before"]) == 3
    assert record["command"] == ["python", "-m", "benchmarks.fast"]
    doc = run_all.DOC.read_text()
    assert "old table" not in doc
    assert doc.startswith("# Benchmarks\n\nhand-written") and doc.endswith("tail\n")
    (row,) = [line for line in doc.splitlines() if line.startswith("| [`fast.py`]")]
    assert "a fake benchmark against a fake baseline" in row and "`ratio` 1.235" in row
    assert f"commit {record['commit'][:7]}" in row


def test_a_failed_or_malformed_run_records_nothing(run_all: ModuleType) -> None:
    write_benchmark(run_all, "crashes", 'print(\'{"bench": "crashes"}\')\nsys.exit(3)')
    write_benchmark(run_all, "no_json", 'print("done, no figures")')
    write_benchmark(run_all, "skips", 'print(\'{"bench": "skips", "skipped": "no CUDA device"}\')')

    assert run_all.main([]) == 1

    assert sorted(path.name for path in run_all.RESULTS.iterdir()) == ["skips.jsonl"]
    table = run_all.DOC.read_text()
    for name in ("crashes", "no_json"):
        assert f"| [`{name}.py`](../benchmarks/{name}.py) |" in table
    assert "not yet recorded by `make bench` (last run" in table and "skipped, no CUDA device" in table


def test_an_unknown_benchmark_is_refused_before_anything_runs(run_all: ModuleType, capsys) -> None:
    write_benchmark(run_all, "fast", "print('{}')")
    with pytest.raises(SystemExit):
        run_all.main(["fast", "typo"])
    assert "no such benchmark: typo" in capsys.readouterr().err
    assert not run_all.RESULTS.exists()


def test_script_arguments_reach_the_script(run_all: ModuleType) -> None:
    body = "import json\nprint(json.dumps({'bench': 'echo', 'args': sys.argv[1:]}))"
    write_benchmark(run_all, "echo", body)
    assert run_all.main(["echo", "--", "--documents", "7"]) == 0
    record = json.loads((run_all.RESULTS / "echo.jsonl").read_text())
    assert record["result"]["args"] == ["--documents", "7"]
    assert record["command"] == ["python", "-m", "benchmarks.echo", "--documents", "7"]
