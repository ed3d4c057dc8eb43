"""Issue 6, items 2 and 3: a trainer never outlives its launcher, one writer per run folder, and a torn
last line of metrics.jsonl does not block resume. Kill tests kill real processes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_trainer import SEQ_LEN, fast_config, write_mixture

from moe_dag.training.run_outputs import MetricsLog
from moe_dag.training.trainer import train


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rows = (np.arange(24)[:, None] + np.arange(SEQ_LEN + 1)[None, :]) % 12 + 1
    return write_mixture(tmp_path / "data", rows)


# ------------------------------------------------------------------ item 3: a torn metrics.jsonl tail


def test_a_torn_last_line_is_ignored_when_read_and_cut_when_truncated(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    log = MetricsLog(path)
    assert [record["step"] for record in log.read()] == [1, 2]
    log.truncate_after(5)
    assert path.read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'


def test_a_corrupt_line_before_the_last_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2"):
        MetricsLog(path).read()


def test_a_run_killed_mid_line_resumes_to_the_uninterrupted_metrics(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = fast_config(6, checkpoint_every=3)
    train(config, data, out)
    uninterrupted = MetricsLog(out / "metrics.jsonl").read()

    # As if killed while appending step 5's line, after the step 3 checkpoint.
    shutil.rmtree(out / "checkpoints" / "step_6")
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])
    train(config, data, out)

    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in uninterrupted]
